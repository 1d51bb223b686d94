"""Storage backends: the protocol (``persisting.queue.backend``) and the implementations that ship.

``Queue`` and ``KVInterface`` are importable from here too, where Persisting's users import them from
(``from persisting.queue import Queue, KVInterface``); they live in ``persisting.client`` and are loaded on first
use, because the client imports these backends. The Lance backends are loaded on first use too: importing Lance
costs a process that only talks to a broker about half its import time.
"""

from typing import TYPE_CHECKING, Any

from .backend import StorageBackend
from .memory import InMemoryBackend

if TYPE_CHECKING:
    from ..client import KVInterface, Queue
    from .lance_backend import LanceBackend
    from .persisting_backend import PersistingBackend

__all__ = ["InMemoryBackend", "KVInterface", "LanceBackend", "PersistingBackend", "Queue", "StorageBackend"]


def __getattr__(name: str) -> Any:
    if name in ("Queue", "KVInterface"):
        from .. import client

        return getattr(client, name)
    if name == "LanceBackend":
        from .lance_backend import LanceBackend

        return LanceBackend
    if name == "PersistingBackend":
        from .persisting_backend import PersistingBackend

        return PersistingBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
