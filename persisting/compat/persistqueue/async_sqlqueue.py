"""persist-queue's async SQLite queues: ``path`` is the database file persist-queue would open; the queue's
storage folder lies beside it (``<path>-persisting``), so ``AsyncSQLiteQueue(d + "/data.db")`` and ``SQLiteQueue(d)``
share items."""

from __future__ import annotations

from typing import Any

from ._sqlcore import AsyncSQL
from .serializers import pickle as default_serializer
from .sqlqueue import _AsyncFILO, _AsyncUnique


class AsyncSQLiteQueue(AsyncSQL):
    def __init__(
        self,
        path: str,
        name: str = "default",
        serializer: Any = default_serializer,
        auto_commit: bool = True,
        *,
        broker: str | None = None,
        durability: str = "sync",
    ) -> None:
        super().__init__(
            path, name, serializer=serializer, auto_commit=auto_commit, broker=broker, durability=durability
        )

    async def _init(self) -> None:
        await self._start()


class AsyncFIFOSQLiteQueue(AsyncSQLiteQueue):
    pass


class AsyncFILOSQLiteQueue(AsyncSQLiteQueue):
    TABLE = _AsyncFILO.TABLE
    NEWEST_FIRST = True


class AsyncUniqueQ(AsyncSQLiteQueue):
    TABLE = _AsyncUnique.TABLE
    UNIQUE = True
