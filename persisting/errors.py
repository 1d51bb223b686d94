"""Every exception the package raises on purpose.

One root, so ``except persisting.PersistingError`` catches all of them::

    PersistingError
    ├── InvalidRecordError (TypeError)   a record the queue cannot store: bad type, bad key, reserved name
    │   └── SchemaConflictError          a value whose type differs from the stored column of that field
    ├── ConfigError (ValueError)         a bad argument, or one that contradicts what is stored on disk
    │   ├── PayloadClearedError          a deduped put references a stored value that was cleared meanwhile
    │   └── DedupConflictError           a put stores a field deduped where the topic stores it plain, or back
    ├── QueueClosedError                 a call on a queue after close()
    ├── StorageError (OSError)           the disk, the write-ahead log or Lance failed; the cause is chained
    │   ├── CorruptionError              stored bytes that fail their checksum or cannot be decoded
    │   └── TopicLockedError             another process holds the topic (use a broker to share it)
    ├── ProtocolError (ValueError)       a malformed or unsupported message between client and broker
    │   └── UnknownExtentError           an arena extent this broker never leased (it restarted since)
    ├── BrokerUnavailableError (ConnectionError)   no reply from the broker within the timeout
    ├── RemoteError                      the broker refused a request; ``type`` names its error class
    ├── Empty (queue.Empty)              nothing to return within the timeout
    └── Full (queue.Full)                no room within the timeout
        └── MemoryFull                   the broker's shared-memory budget had no room (a dense batch's put
                                         spills to a spool file instead; zerocopy_mode="force" raises it)

Errors from libraries (Lance, pyarrow, the OS) are translated at the boundary with ``raise ... from exc``
so the original stays visible in the traceback.
"""

from __future__ import annotations

import queue as _stdlib_queue


class PersistingError(Exception):
    """Root of every error raised by persisting."""


class InvalidRecordError(PersistingError, TypeError):
    """A record (or one of its values) cannot be stored; the message names the field and the fix."""


class SchemaConflictError(InvalidRecordError):
    """A value's type differs from the type already stored for that field."""

    def __init__(self, field: str, stored: str, given: str) -> None:
        self.field = field
        self.stored = stored
        self.given = given
        super().__init__(
            f"field {field!r} is stored as {stored}, but this record gives {given}; "
            f"convert the value to {stored} (or use another field name) before putting it"
        )


class ConfigError(PersistingError, ValueError):
    """A constructor argument is invalid or contradicts what is stored on disk."""


class InvalidSerializerError(ConfigError, AttributeError):
    """A serializer lacks the methods it needs (an ``AttributeError`` too, as persist-queue raises)."""


class PayloadClearedError(ConfigError):
    """A put references a stored value of a deduped field (a payload row) that is no longer live: the last sample
    referencing it was cleared. A ``Queue`` with ``dedup`` catches it, forgets those values and stores them again
    (docs/concepts/dedup.md, "Lifetime"). ``rows``: the payload rows (global indexes) that are not live."""

    def __init__(self, message: str, rows: list[int] | tuple[int, ...] = ()) -> None:
        self.rows = list(rows)
        super().__init__(message)


class DedupConflictError(ConfigError):
    """A put stores field ``field`` one way (deduped: references ``<field>@payload`` to payload rows; or plain)
    while the topic stores it the other way (``deduped``: how the topic stores it). A topic stores each field one
    way, so that every sample's value is read by the same name. A ``Queue(dedup="auto")`` catches it, learns the
    topic's choice and puts again; with ``dedup=True`` or field names, the message names the fix."""

    def __init__(self, message: str, field: str = "", deduped: bool = False) -> None:
        self.field = field
        self.deduped = deduped
        super().__init__(message)


class QueueClosedError(PersistingError):
    """The queue was closed; open a new one."""


class StorageError(PersistingError, OSError):
    """Persisting to disk failed. The underlying error is chained as ``__cause__``."""


class CorruptionError(StorageError):
    """Stored bytes failed their checksum or could not be decoded."""


class TopicLockedError(StorageError):
    """Another process has this topic open in embedded mode."""


class ProtocolError(PersistingError, ValueError):
    """A message that does not follow persisting.protocol (wrong version, malformed, unknown operation)."""


class ProtocolVersionError(ProtocolError):
    """The other side speaks another protocol version: upgrade client and broker to the same release."""


class UnknownExtentError(ProtocolError):
    """A tensor request names an arena extent this broker never leased to the caller: most often one leased
    from a broker that has restarted since (the client then leases afresh)."""


class BrokerUnavailableError(PersistingError, ConnectionError):
    """The broker did not answer within the timeout (is persisting-broker running on that address?).

    Raised by a put (``put``, ``put_batch``, a tensor batch), the put may have been stored all the same:
    ``idempotency_key`` is the key it was sent with, and the same put sent again with
    ``idempotency_key=err.idempotency_key`` is stored once (docs/concepts/safe-retries.md)."""

    idempotency_key: str | None = None


class RemoteError(PersistingError):
    """An error the broker raised for a request that has no local class to map to."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type = type_name
        super().__init__(f"{type_name}: {message}")


class Empty(PersistingError, _stdlib_queue.Empty):
    """Nothing became available within the timeout."""


class Full(PersistingError, _stdlib_queue.Full):
    """No room became available within the timeout."""


class MemoryFull(Full):
    """The broker's shared memory (its budget) had no room for a batch within the wait; a put of dense tensors
    spills it to a spool file on disk instead (docs/concepts/batch-sizes.md)."""


__all__ = [
    "BrokerUnavailableError",
    "ConfigError",
    "CorruptionError",
    "DedupConflictError",
    "Empty",
    "Full",
    "InvalidRecordError",
    "MemoryFull",
    "PayloadClearedError",
    "PersistingError",
    "ProtocolError",
    "QueueClosedError",
    "RemoteError",
    "SchemaConflictError",
    "StorageError",
    "TopicLockedError",
    "UnknownExtentError",
]
