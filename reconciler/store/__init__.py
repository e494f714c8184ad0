"""The durable store: the only package that writes SQL."""

from .dbapi import StoreError
from .engine import Store, default_store_url
from .repository import StoredObject

__all__ = ["Store", "StoreError", "StoredObject", "default_store_url"]
