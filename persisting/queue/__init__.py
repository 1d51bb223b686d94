"""Storage backends: the protocol (``persisting.queue.backend``) and the implementations that ship."""

from .backend import StorageBackend
from .lance_backend import LanceBackend
from .memory import InMemoryBackend
from .persisting_backend import PersistingBackend

__all__ = ["InMemoryBackend", "LanceBackend", "PersistingBackend", "StorageBackend"]
