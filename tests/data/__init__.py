"""Shared data and small helpers of the manifest/apply test modules."""
