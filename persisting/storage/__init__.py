"""Storage backends: the protocol (``persisting.storage.backend``) and the implementations that ship.

The Lance backends are loaded on first use: importing Lance costs a process that only talks to a broker about
half its import time. (Persisting's users import all this, with ``Queue`` and ``KVInterface``, from the old
name ``persisting.queue``, which stays.)
"""

from typing import TYPE_CHECKING, Any

from .backend import StorageBackend
from .memory import InMemoryBackend

if TYPE_CHECKING:
    from .lance_backend import LanceBackend
    from .persisting_backend import PersistingBackend

__all__ = ["InMemoryBackend", "LanceBackend", "PersistingBackend", "StorageBackend"]


def __getattr__(name: str) -> Any:
    if name == "LanceBackend":
        from .lance_backend import LanceBackend

        return LanceBackend
    if name == "PersistingBackend":
        from .persisting_backend import PersistingBackend

        return PersistingBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
