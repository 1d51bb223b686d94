"""persisting: a same-node data broker for co-located GPU workers (embedded mode: ``Queue`` in-process)."""

from .client import Queue
from .errors import (
    ConfigError,
    CorruptionError,
    Empty,
    Full,
    InvalidRecordError,
    PersistingError,
    QueueClosedError,
    SchemaConflictError,
    StorageError,
    TopicLockedError,
)
from .sync import SyncQueue

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CorruptionError",
    "Empty",
    "Full",
    "InvalidRecordError",
    "PersistingError",
    "Queue",
    "QueueClosedError",
    "SchemaConflictError",
    "StorageError",
    "SyncQueue",
    "TopicLockedError",
]
