"""persist-queue's file ``Queue`` / ``AsyncQueue`` behaviour, once, as async code: maxsize (put blocks, Full),
get (blocks, Empty), task_done / join / unfinished_tasks, and autosave. ``path`` is the queue's directory.

autosave=False (the default): a get is a lease until task_done, as persist-queue saves its read position only
then; a reopen after gets without task_done sees those items again. autosave=True: a get is final at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from persisting.errors import Empty, Full

from ._sqlcore import check_timeout
from ._store import Store
from .serializers import pickle as default_serializer

# A put waiting for room in a full queue is woken by gets of this process at once; gets by other processes it
# sees on a re-check at this period (maxsize is a per-process convenience in persist-queue too).
FULL_RECHECK_S = 0.05
# persist-queue's file Queue writes each put and renames its info file without an fsync: it survives kill -9 of
# the process, not a power loss, which is persisting's durability="process".


class AsyncFile:
    def __init__(
        self,
        path: str,
        maxsize: int = 0,
        chunksize: int = 100,
        tempdir: str | None = None,
        serializer: Any = None,
        autosave: bool = False,
        *,
        broker: str | None = None,
        durability: str = "process",
    ) -> None:
        serializer = serializer if serializer is not None else default_serializer
        self.path = path
        self.maxsize = maxsize
        self.chunksize = chunksize  # persist-queue's items per chunk file; storage here is not in chunk files
        self.serializer = serializer
        self.autosave = autosave
        os.makedirs(path, exist_ok=True)
        if tempdir and os.stat(path).st_dev != os.stat(tempdir).st_dev:
            raise ValueError("tempdir has to be located on same path filesystem")
        self.tempdir = tempdir or path
        self._store = Store(path, "queue", serializer, broker=broker, durability=durability, prefer_file=True)
        self._uncommitted: list[int] = []
        self.unfinished_tasks = 0
        self._started = False
        self._changed: asyncio.Condition | None = None
        self._waiting = 0  # puts waiting for room and joins waiting in ``_changed``

    async def _start(self) -> None:
        if not self._started:
            await self._store.open()
            self._started = True
            self.unfinished_tasks = await self.qsize()
            self._changed = asyncio.Condition()

    async def qsize(self) -> int:
        await self._store.open()
        ready, _ = await self._store.counts()
        return max(0, ready)

    async def empty(self) -> bool:
        return await self.qsize() == 0

    async def full(self) -> bool:
        return self.maxsize > 0 and await self.qsize() >= self.maxsize

    async def _notify(self) -> None:
        if not self._waiting:  # nobody to wake: skip the condition's lock (a few us of a ~60 us get)
            return
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        await self._start()
        check_timeout(timeout)
        if self.maxsize > 0:
            deadline = None if timeout is None else time.monotonic() + timeout
            while await self.qsize() >= self.maxsize:
                left = None if deadline is None else deadline - time.monotonic()
                if not block or (left is not None and left <= 0):
                    raise Full
                assert self._changed is not None
                async with self._changed:
                    wait_s = FULL_RECHECK_S if left is None else min(FULL_RECHECK_S, left)
                    self._waiting += 1
                    try:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), wait_s)
                    finally:
                        self._waiting -= 1
        await self._store.put(item)
        self.unfinished_tasks += 1

    async def put_nowait(self, item: Any) -> None:
        await self.put(item, False)

    async def get(self, block: bool = True, timeout: float | None = None) -> Any:
        await self._start()
        if block:
            check_timeout(timeout)
        item = await self._store.take(wait=block, timeout=timeout, lease=not self.autosave)
        if item is None:
            raise Empty
        if self.autosave:
            await self._store.forget([item.pqid])
        else:
            self._uncommitted.append(item.pqid)
        await self._notify()
        return item.data

    async def get_nowait(self) -> Any:
        return await self.get(False)

    async def task_done(self) -> None:
        await self._start()
        if self.unfinished_tasks - 1 < 0:
            raise ValueError("task_done() called too many times.")
        self.unfinished_tasks -= 1
        done, self._uncommitted = self._uncommitted, []
        await self._store.commit(done)
        await self._notify()

    async def join(self) -> None:
        await self._start()
        assert self._changed is not None
        self._waiting += 1
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self.unfinished_tasks <= 0)
        finally:
            self._waiting -= 1

    async def close(self) -> None:
        if self._started and self._uncommitted:
            pending, self._uncommitted = self._uncommitted, []
            await self._store.give_back(pending)
        await self._store.close()

    async def __aenter__(self) -> AsyncFile:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
