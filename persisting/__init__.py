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
from .kv import KVInterface
from .meta import BatchMeta, FieldMeta, SampleMeta
from .reservation import Reservation
from .samplers import GRPOGroupNSampler, LengthBalancedSampler, RankAwareSampler, Sampler, SequentialSampler
from .sync import SyncQueue, SyncReservation

__version__ = "0.1.0"

__all__ = [
    "BatchMeta",
    "BrokerUnavailableError",
    "ConfigError",
    "CorruptionError",
    "Empty",
    "FieldMeta",
    "Full",
    "GRPOGroupNSampler",
    "InvalidRecordError",
    "KVInterface",
    "LengthBalancedSampler",
    "PersistingError",
    "ProtocolError",
    "Queue",
    "QueueClosedError",
    "RankAwareSampler",
    "RemoteError",
    "Reservation",
    "SampleMeta",
    "Sampler",
    "SchemaConflictError",
    "SequentialSampler",
    "StorageError",
    "SyncQueue",
    "SyncReservation",
    "TopicLockedError",
]
