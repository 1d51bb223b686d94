"""persisting: a same-node data broker for co-located GPU workers (embedded mode: ``Queue`` in-process)."""

from .client.kv import KVInterface
from .client.queue import Queue
from .client.sync import SyncQueue, SyncReservation
from .engine.samplers import (
    GRPOGroupNSampler,
    LengthBalancedSampler,
    PickSampler,
    RankAwareSampler,
    Sampler,
    SequentialSampler,
)
from .errors import (
    BrokerUnavailableError,
    ConfigError,
    CorruptionError,
    DedupConflictError,
    Empty,
    Full,
    InvalidRecordError,
    MemoryFull,
    PayloadClearedError,
    PersistingError,
    ProtocolError,
    ProtocolVersionError,
    QueueClosedError,
    RemoteError,
    SchemaConflictError,
    StorageError,
    TopicLockedError,
)
from .tensors.meta import BatchMeta, FieldMeta, SampleMeta
from .tensors.reservation import Reservation

__version__ = "0.1.0"

__all__ = [
    "BatchMeta",
    "BrokerUnavailableError",
    "ConfigError",
    "CorruptionError",
    "DedupConflictError",
    "Empty",
    "FieldMeta",
    "Full",
    "GRPOGroupNSampler",
    "InvalidRecordError",
    "KVInterface",
    "LengthBalancedSampler",
    "MemoryFull",
    "PayloadClearedError",
    "PersistingError",
    "PickSampler",
    "ProtocolError",
    "ProtocolVersionError",
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
