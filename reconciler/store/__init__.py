"""The durable store: the only package that writes SQL."""

from .connect import default_store_url
from .dbapi import StoreError
from .engine import Store
from .repository import StoredObject

__all__ = ["Store", "StoreError", "StoredObject", "default_store_url"]
