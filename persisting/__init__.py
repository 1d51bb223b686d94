"""persisting: a same-node data broker for co-located GPU workers (embedded mode: ``Queue`` in-process)."""

from .client import Queue
from .errors import (
    BrokerUnavailableError,
    ConfigError,
    CorruptionError,
    Empty,
    Full,
    InvalidRecordError,
    PersistingError,
    ProtocolError,
    QueueClosedError,
    RemoteError,
    SchemaConflictError,
    StorageError,
    TopicLockedError,
)
from .sync import SyncQueue

__version__ = "0.1.0"

__all__ = [
    "BrokerUnavailableError",
    "ConfigError",
    "CorruptionError",
    "Empty",
    "Full",
    "InvalidRecordError",
    "PersistingError",
    "ProtocolError",
    "Queue",
    "QueueClosedError",
    "RemoteError",
    "SchemaConflictError",
    "StorageError",
    "SyncQueue",
    "TopicLockedError",
]
