"""persist-queue's ``PriorityQueue``: lowest ``priority`` first, then oldest. Each priority is a partition of
the queue's topic; a get takes from the lowest-priority partition holding ready items (an atomic take there).
A blocking get re-checks at ``PRIORITY_RECHECK_S`` (the only class here whose blocking get is a re-check)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from persisting.errors import Empty

from .. import _engine
from ._sqlcore import check_timeout
from ._state import TASK
from ._store import Store, storage_root
from ._twin import CLOSE_AT_EXIT_S, close_once, opened
from .serializers import pickle as default_serializer
from .sqlqueue import database_file

PRIORITY_RECHECK_S = 0.05


class PriorityQueue:
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
    ) -> None:
        self.path = path
        self.name = name
        self._store = Store(
            storage_root(database_file(path, db_file_name)), f"priority_queue_{name}", serializer, broker=broker
        )
        _engine.run(self._store.open())
        opened(self)

    async def _priorities(self) -> list[tuple[int, int]]:
        out = []
        for partition, info in (await self._store.queue.partitions()).items():
            if partition.startswith("p"):
                task = info["tasks"].get(TASK, {"consumed": 0, "leased": 0})
                out.append((int(partition[1:]), info["samples"] - task["consumed"] - task["leased"]))
        return sorted(out)

    def put(self, item: Any, priority: int = 0, block: bool = True) -> int | None:
        return _engine.run(self._store.put(item, partition=f"p{int(priority)}"))

    def put_nowait(self, item: Any, priority: int = 0) -> int | None:
        return self.put(item, priority=priority, block=False)

    async def _get(self, block: bool, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for priority, ready in await self._priorities():
                if ready > 0:
                    item = await self._store.take(wait=False, timeout=None, lease=False, partition=f"p{priority}")
                    if item is not None:
                        await self._store.forget([item.pqid], partition=f"p{priority}", now=True)
                        return item.data
            if not block or (deadline is not None and time.monotonic() >= deadline):
                raise Empty
            await asyncio.sleep(PRIORITY_RECHECK_S)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block:
            check_timeout(timeout)
        return _engine.run(self._get(block, timeout))

    def get_nowait(self) -> Any:
        return self.get(False)

    async def _qsize(self) -> int:
        return sum(ready for _, ready in await self._priorities())

    def qsize(self) -> int:
        return _engine.run(self._qsize())

    def empty(self) -> bool:
        return self.qsize() == 0

    def full(self) -> bool:
        return False

    def __len__(self) -> int:
        return self.qsize()

    def close(self) -> None:
        close_once(self, self._store.close)

    def __del__(self) -> None:
        if "_store" in self.__dict__:
            close_once(self, self._store.close, CLOSE_AT_EXIT_S)
