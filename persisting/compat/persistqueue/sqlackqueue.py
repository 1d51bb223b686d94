"""persist-queue's ack queues (``SQLiteAckQueue`` = ``FIFOSQLiteAckQueue``, ``FILOSQLiteAckQueue``,
``UniqueAckQ``): a get leases the item to this process until ``ack`` / ``ack_failed`` (final) or ``nack`` (ready
again); through a broker, the items a killed process held are handed out again."""

from __future__ import annotations

from typing import Any

from ._sqlcore import AckStatus, AsyncSQL
from ._twin import twin
from .sqlqueue import ACK_METHODS, METHODS, _SyncSQL


class _AsyncAck(AsyncSQL):
    TABLE = "ack_queue"
    ACK = True


class _AsyncAckFILO(_AsyncAck):
    TABLE = "ack_filo_queue"
    NEWEST_FIRST = True


class _AsyncAckUnique(_AsyncAck):
    TABLE = "ack_unique_queue"
    UNIQUE = True


class _SyncAck(_SyncSQL):
    def __init__(self, path: str, auto_resume: bool = True, **kwargs: Any) -> None:
        super().__init__(path, auto_resume=auto_resume, **kwargs)


@twin(AsyncSQL, METHODS + ACK_METHODS)
class SQLiteAckQueue(_SyncAck):
    _IMPL = _AsyncAck


FIFOSQLiteAckQueue = SQLiteAckQueue


@twin(AsyncSQL, METHODS + ACK_METHODS)
class FILOSQLiteAckQueue(_SyncAck):
    _IMPL = _AsyncAckFILO


@twin(AsyncSQL, METHODS + ACK_METHODS)
class UniqueAckQ(_SyncAck):
    _IMPL = _AsyncAckUnique


__all__ = ["AckStatus", "FIFOSQLiteAckQueue", "FILOSQLiteAckQueue", "SQLiteAckQueue", "UniqueAckQ"]
