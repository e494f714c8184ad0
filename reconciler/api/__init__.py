"""API models per kind, semantic validation and schema generation."""
