"""persist-queue's SQLite queues (``SQLiteQueue`` = ``FIFOSQLiteQueue``, ``FILOSQLiteQueue``, ``UniqueQ``) on
persisting's engine. ``path`` is the directory persist-queue keeps ``data.db`` in (``db_file_name``), created if
missing; the queue's storage lies beside that file (``_store.storage_root``); ``":memory:"`` is a queue that lives
until it is closed."""

from __future__ import annotations

import os
from typing import Any

from .. import _engine
from ._sqlcore import AsyncSQL
from ._twin import CLOSE_AT_EXIT_S, close_once, opened, twin
from .serializers import pickle as default_serializer

METHODS = ("put", "put_nowait", "get", "get_nowait", "task_done", "update", "qsize", "empty", "full", "queue")
ACK_METHODS: tuple[str, ...] = ("ack", "ack_failed", "nack", "resume_unack_tasks", "clear_acked_data", "unack_count")
ACK_METHODS += ("acked_count", "ready_count", "ack_failed_count", "active_size")


def database_file(path: str, db_file_name: str | None) -> str:
    """The database file persist-queue would open in ``path`` (the folder is made, as persist-queue does)."""
    if path == ":memory:":
        return path
    os.makedirs(path, exist_ok=True)
    return os.path.join(path, db_file_name or "data.db")


class _SyncSQL:
    _IMPL: type[AsyncSQL] = AsyncSQL

    def __init__(
        self,
        path: str,
        name: str = "default",
        multithreading: bool = False,
        timeout: float = 10.0,
        auto_commit: bool = True,
        serializer: Any = default_serializer,
        db_file_name: str | None = None,
        *,
        broker: str | None = None,
        durability: str = "sync",
        **extra: Any,
    ) -> None:
        # multithreading and timeout are SQLite connection settings: every handle here is thread-safe.
        self.path = path
        self.name = name
        self.multithreading = multithreading
        self.timeout = timeout
        self.db_file_name = db_file_name or "data.db"
        self._impl = self._IMPL(
            database_file(path, db_file_name),
            name,
            serializer=serializer,
            auto_commit=auto_commit,
            broker=broker,
            durability=durability,
            **extra,
        )
        _engine.run(self._impl._start())
        opened(self)

    @property
    def _serializer(self) -> Any:
        return self._impl._serializer

    @property
    def auto_commit(self) -> bool:
        return self._impl.auto_commit

    @property
    def size(self) -> int:
        return int(self.qsize())  # type: ignore[attr-defined]

    total = size

    def __len__(self) -> int:
        return self.size

    def shrink_disk_usage(self) -> None:
        _engine.run(self._impl.shrink_disk_usage())

    def close(self) -> None:
        close_once(self, self._impl.close)

    def __del__(self) -> None:
        if "_impl" in self.__dict__:
            close_once(self, self._impl.close, CLOSE_AT_EXIT_S)


@twin(AsyncSQL, METHODS)
class SQLiteQueue(_SyncSQL):
    """SQLite3-compatible FIFO queue."""


FIFOSQLiteQueue = SQLiteQueue


class _AsyncFILO(AsyncSQL):
    TABLE = "filo_queue"
    NEWEST_FIRST = True


class _AsyncUnique(AsyncSQL):
    TABLE = "unique_queue"
    UNIQUE = True


@twin(AsyncSQL, METHODS)
class FILOSQLiteQueue(_SyncSQL):
    """Newest first (persist-queue's FILO)."""

    _IMPL = _AsyncFILO


@twin(AsyncSQL, METHODS)
class UniqueQ(_SyncSQL):
    """A put of bytes equal to a live item's (dicts with sorted keys) is dropped; put returns None for it."""

    _IMPL = _AsyncUnique
