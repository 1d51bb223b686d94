"""persist-queue 1.1.0's API on persisting's engine: ``import persisting.compat.persistqueue as persistqueue``.

Same classes, constructor arguments, methods, exceptions and serializers; one queue may be opened from several
processes through a broker (``broker=`` or ``PERSISTING_BROKER``). Embedded (no broker) a queue belongs to one
process: a second process gets ``TopicLockedError`` instead of corrupting it. See the docs page
"persist-queue compatibility" (Guides).
"""

from persisting.errors import Empty, Full

from . import exceptions, serializers
from ._sqlcore import AckStatus
from .async_queue import AsyncQueue
from .async_sqlqueue import AsyncFIFOSQLiteQueue, AsyncFILOSQLiteQueue, AsyncSQLiteQueue, AsyncUniqueQ
from .pdict import PDict
from .priorityqueue import PriorityQueue
from .queue import Queue
from .sqlackqueue import FIFOSQLiteAckQueue, FILOSQLiteAckQueue, SQLiteAckQueue, UniqueAckQ
from .sqlqueue import FIFOSQLiteQueue, FILOSQLiteQueue, SQLiteQueue, UniqueQ

__author__ = "persisting (API of persist-queue by Peter Wang)"
__license__ = "BSD"
__version__ = "1.1.0"

__all__ = [
    "AckStatus",
    "AsyncFIFOSQLiteQueue",
    "AsyncFILOSQLiteQueue",
    "AsyncQueue",
    "AsyncSQLiteQueue",
    "AsyncUniqueQ",
    "Empty",
    "FIFOSQLiteAckQueue",
    "FIFOSQLiteQueue",
    "FILOSQLiteAckQueue",
    "FILOSQLiteQueue",
    "Full",
    "PDict",
    "PriorityQueue",
    "Queue",
    "SQLiteAckQueue",
    "SQLiteQueue",
    "UniqueAckQ",
    "UniqueQ",
    "exceptions",
    "serializers",
]
