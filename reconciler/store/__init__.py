"""The durable store: the only package that writes SQL."""

from .engine import Store, default_store_url
from .repository import StoredObject

__all__ = ["Store", "StoredObject", "default_store_url"]
