"""The command line: typer verbs, rendering in render.py, no business logic."""
