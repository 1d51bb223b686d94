"""The SQLite family's behaviour, once, as async code: FIFO/FILO/Unique, auto_commit, and the ack queues.

``AsyncSQL`` is what ``AsyncSQLiteQueue`` & co. are and what the blocking ``SQLiteQueue`` & co. run (``_twin``).
"""

from __future__ import annotations

import warnings
from typing import Any

from persisting.errors import ConfigError, Empty

from . import _store
from ._state import ACK_FAILED, ACKED, DELETED, READY, UNACK
from ._store import Item, Store
from .serializers import pickle as default_serializer


class AckStatus:
    inited = "0"
    ready = "1"
    unack = "2"
    acked = "5"
    ack_failed = "9"


def check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")


class AsyncSQL:
    """One SQLite-family queue. ``ack``: an ack queue (gets are leases until ack/nack/ack_failed)."""

    TABLE = "queue"
    NEWEST_FIRST = False
    UNIQUE = False
    ACK = False

    def __init__(
        self,
        root: str,
        name: str = "default",
        *,
        serializer: Any = default_serializer,
        auto_commit: bool = True,
        auto_resume: bool = True,
        broker: str | None = None,
        durability: str = "sync",
    ) -> None:
        self.path = root
        self.name = name
        self._serializer = serializer
        if self.ACK and not auto_commit:
            warnings.warn("disable auto commit is not supported in ack queue", stacklevel=3)
            auto_commit = True
        self.auto_commit = auto_commit
        self._auto_resume = auto_resume
        self._store = Store(
            _store.storage_root(root),
            f"{self.TABLE}_{name}",
            serializer,
            unique=self.UNIQUE,
            newest_first=self.NEWEST_FIRST,
            broker=broker,
            durability=durability,
        )
        self._uncommitted: list[int] = []  # auto_commit=False: ids got since the last task_done (leased)
        self._unack_cache: dict[int, Any] = {}  # ack queues: id -> the object get returned (ack(item) finds it)
        self._started = False

    async def _start(self) -> None:
        if self._started:
            return
        await self._store.open()
        self._started = True
        if self.ACK or self.UNIQUE:
            await self._store.state.repair(self.ACK)
        if self.ACK:
            await self._resume(self._auto_resume)

    # -- put / get ------------------------------------------------------------------------------------------

    async def put(self, item: Any, block: bool = True) -> int | None:
        """Store ``item``; returns its id (None for a duplicate in a Unique queue). ``block`` is ignored."""
        await self._start()
        return await self._store.put(item)

    async def put_nowait(self, item: Any) -> int | None:
        return await self.put(item, block=False)

    async def get(
        self,
        block: bool = True,
        timeout: float | None = None,
        id: Any = None,
        next_in_order: bool = False,
        raw: bool = False,
    ) -> Any:
        await self._start()
        pqid = _id_of(id)
        if next_in_order and not isinstance(next_in_order, bool):
            raise ValueError("'next_in_order' must be a boolean (True/False)")
        if next_in_order and pqid is None:
            raise ValueError("'next_in_order' requires the preceding 'id' be specified.")
        if block:
            check_timeout(timeout)
        lease = self.ACK or not self.auto_commit
        item = await self._store.take(
            wait=block,
            timeout=timeout,
            lease=lease,
            pqid=None if next_in_order else pqid,
            after=pqid if next_in_order else None,
            note=UNACK if self.ACK else None,
        )
        if item is None:
            raise Empty
        await self._taken(item)
        if raw:
            return {"pqid": item.pqid, "data": item.data, "timestamp": item.timestamp}
        return item.data

    async def get_nowait(self, id: Any = None, raw: bool = False) -> Any:
        return await self.get(block=False, id=id, raw=raw)

    async def _taken(self, item: Item) -> None:
        if self.ACK:
            self._unack_cache[item.pqid] = item.data
            # Synced only for a reopen with auto_resume=False, which must still see it unacknowledged after the lease
            # is gone; with auto_resume a crash makes it ready again with or without the record (_store's doc).
            # Through a broker the take wrote it already (noted), durably.
            if not item.noted:
                await self._store.state.set([item.pqid], UNACK, lazily=self._auto_resume)
        elif self.auto_commit:
            await self._store.forget([item.pqid], lazily=True)  # shares the take's fate (_store's doc)
        else:
            self._uncommitted.append(item.pqid)

    async def task_done(self) -> None:
        """auto_commit=False: make the gets since the last task_done final (until then a reopen sees them)."""
        if self.ACK or self.auto_commit:
            return
        done, self._uncommitted = self._uncommitted, []
        await self._store.commit(done)

    async def update(self, item: Any, id: Any = None) -> int:
        pqid = None
        if isinstance(item, dict) and "pqid" in item:
            pqid = item.get("pqid")
            item = item.get("data")
        if id is not None:
            pqid = id
        if pqid is None:
            raise ValueError("Provide an id or raw item")
        await self._start()
        await self._store.update(int(pqid), item)
        return int(pqid)

    # -- sizes ----------------------------------------------------------------------------------------------

    async def qsize(self) -> int:
        await self._start()
        ready, _ = await self._store.counts()
        return max(0, ready)

    async def empty(self) -> bool:
        return await self.qsize() == 0

    async def full(self) -> bool:
        return False

    async def queue(self) -> list[dict[str, Any]]:
        await self._start()
        rows = []
        for item, _ in await self._store.all_items():
            row: dict[str, Any] = {"id": item.pqid, "data": item.data, "timestamp": item.timestamp}
            if self.ACK:
                row["status"] = await self._status_of(item.pqid)
            rows.append(row)
        return rows

    async def shrink_disk_usage(self) -> None:
        """persist-queue VACUUMs; here the rows of deleted items go at once (the engine compacts on its own)."""
        await self._start()
        await self._store.flush_deletes()

    async def close(self) -> None:
        """Close the queue; gets not made final by task_done are given back (a rollback)."""
        if self._started and self._uncommitted:
            pending, self._uncommitted = self._uncommitted, []
            await self._store.give_back(pending)
        await self._store.close()

    async def __aenter__(self) -> AsyncSQL:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- ack queues -----------------------------------------------------------------------------------------

    def _find_id(self, item: Any, id: Any) -> int | None:
        if id is not None and item is not None:
            raise ValueError("Specify an id or an item, not both.")
        if id is None and item is None:
            raise ValueError("Specify an id or an item.")
        if id is not None:
            return int(id) if isinstance(id, int) or (isinstance(id, str) and id.isnumeric()) else None
        if isinstance(item, dict) and "pqid" in item:
            return int(item["pqid"])
        for key, value in self._unack_cache.items():
            if value is item:  # persist-queue finds the item by identity among those this handle got
                return key
        return None

    async def _settle(self, item: Any, id: Any, status: int) -> int | None:
        await self._start()
        pqid = self._find_id(item, id)
        if pqid is None:
            return None
        self._unack_cache.pop(pqid, None)
        if status == READY:
            await self._store.state.set([pqid], READY)  # before the give-back: a re-get's UNACK comes after it
            await self._store.give_back([pqid])
        else:
            await self._store.state.consume([pqid], status)
        return pqid

    async def ack(self, item: Any = None, id: Any = None) -> int | None:
        return await self._settle(item, id, ACKED)

    async def ack_failed(self, item: Any = None, id: Any = None) -> int | None:
        return await self._settle(item, id, ACK_FAILED)

    async def nack(self, item: Any = None, id: Any = None) -> int | None:
        return await self._settle(item, id, READY)

    async def resume_unack_tasks(self) -> None:
        """Give back the items this handle holds unacknowledged, and those whose holder is gone (their leases
        ended with their process); items other live processes hold stay theirs (persist-queue takes them away)."""
        await self._start()
        await self._resume(True)

    async def _resume(self, give_back: bool) -> None:
        held = list(self._unack_cache)
        self._unack_cache.clear()
        await self._store.state.catch_up()
        # Items recorded as got (UNACK) or got and never settled whose lease is gone (a restart, a dead holder):
        # take them again by id, so that they are either held here or given back below.
        orphans = [p for p, s in self._store.state.status.items() if s == UNACK and p not in held]
        for pqid in orphans:
            again = await self._store.take(wait=False, timeout=None, lease=True, pqid=pqid)
            if again is not None:
                held.append(pqid)
        if give_back:
            if held:
                await self._store.state.set(held, READY)
                await self._store.give_back(held)
        else:
            for pqid in held:
                self._unack_cache[pqid] = None
            await self._store.state.set([p for p in held if self._store.state.status.get(p) != UNACK], UNACK)

    async def _status_of(self, pqid: int) -> str:
        s = self._store.state.status.get(pqid)
        if s is None:
            return AckStatus.unack if pqid in self._unack_cache else AckStatus.inited
        return str(s)

    async def _count_status(self, status: int) -> int:
        await self._start()
        await self._store.state.catch_up()
        return sum(1 for s in self._store.state.status.values() if s == status)

    async def unack_count(self) -> int:
        await self._start()
        _, leased = await self._store.counts()
        return leased

    async def acked_count(self) -> int:
        return await self._count_status(ACKED)

    async def ack_failed_count(self) -> int:
        return await self._count_status(ACK_FAILED)

    async def ready_count(self) -> int:
        return await self._count_status(READY)

    async def active_size(self) -> int:
        return await self.qsize() + len(self._unack_cache)

    async def clear_acked_data(
        self, max_delete: int = 1000, keep_latest: int = 1000, clear_ack_failed: bool = False
    ) -> None:
        """Delete acked items (and ack-failed ones with ``clear_ack_failed``) beyond the ``keep_latest`` newest,
        at most ``max_delete`` of them (0 or None: no limit), as persist-queue does."""
        if max_delete is not None and not isinstance(max_delete, int):
            raise ConfigError(f"max_delete must be an int, got {max_delete!r}")
        await self._start()
        await self._store.state.catch_up()
        wanted = {ACKED, ACK_FAILED} if clear_ack_failed else {ACKED}
        chosen = sorted((p for p, s in self._store.state.status.items() if s in wanted), reverse=True)
        if keep_latest and keep_latest > 0:
            chosen = chosen[keep_latest:]
        if max_delete and max_delete > 0:
            chosen = chosen[:max_delete]
        if chosen:
            await self._store.state.set(chosen, DELETED)
            if not self.UNIQUE:
                await self._store.forget(chosen, now=True)


def _id_of(id: Any) -> int | None:
    if isinstance(id, dict) and "pqid" in id:
        return int(id["pqid"])
    if isinstance(id, int) and not isinstance(id, bool):
        return id
    return None


__all__ = ["AckStatus", "AsyncSQL", "Empty", "_store"]
