"""One persist-queue queue on persisting's engine: a topic, its items, takes, and durable per-item state.

Layout of a queue's topic (one topic per persist-queue table, ``<table>_<name>``):

- partition ``items``: one record per ``put``: ``data`` (the serializer's bytes, made in this process), ``ts``
  (time.time() of the put) and, for the Unique queues, ``h`` (sha256 of the bytes). The item's id (persist-queue's
  ``pqid``) is its global index + 1: assigned once by the engine, never reused, so ids from every process agree.
- partition ``state``: one record per state change of an item (``_state.py``: the records, their mirror, and what
  is synced when).
- task ``get`` on ``items``: the consumption cursor. A take is the engine's atomic take (``get_meta``): in the
  broker it is one operation, so two processes never get the same item. Consume-on-fetch where persist-queue
  deletes at ``get``; a lease (``delivery="ack"``) where the item stays the taker's until a commit
  (``mark_consumed``: ack, ``task_done``) or a give-back (``give_back``: nack, rollback of an uncommitted get).
  A lease whose process dies is given back by the broker, so a killed consumer's items are handed out again.

Unique: a put is a duplicate when an earlier item with the same bytes is still live at the put's global index
(not ``DELETED`` by a state record below it). Every process reads the topic in index order, so every process
takes the same decision without a lock: the putter returns None and marks the duplicate taken; a taker that
meets one before that skips it the same way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from persisting import BatchMeta, PickSampler, Queue, SampleMeta, TopicLockedError
from persisting.errors import ConfigError, StorageError

from .. import _engine
from . import _serial
from ._state import DELETED, ITEMS, READ_PAGE_RECORDS, TASK, State

# persist-queue's unacked items wait for ever; an engine lease needs an end, so it is made longer than any run.
UNACK_LEASE_SECONDS = 10 * 365 * 24 * 3600.0
# Consumed items' rows are deleted in batches of this many (and at close, shrink_disk_usage): a clear makes the engine
# flush, and a get that reads its row back from Lance costs ~2 ms instead of ~0.3 ms from the tail.
CLEAR_BATCH_ITEMS = 10_000
BROKER_ENV = "PERSISTING_BROKER"
STORAGE_SUFFIX = "-persisting"


@dataclass(frozen=True)
class Item:
    pqid: int
    data: Any
    timestamp: float
    noted: bool = False  # its state record (``take``'s ``note``) was written with the take


def broker_address(broker: str | None) -> str | None:
    return broker if broker is not None else (os.environ.get(BROKER_ENV) or None)


def storage_root(db_file: str) -> str:
    """The storage folder of the SQLite-family queues of database file ``db_file``: ``<db_file>-persisting``
    beside it (as SQLite keeps ``<db_file>-wal``), so ``path`` means the file it means in persist-queue, the file
    may exist already (an empty one, say) and may be deleted by its owner. Like SQLite, the folder holding the
    file must exist."""
    if db_file == ":memory:":
        return db_file
    folder = os.path.dirname(os.path.abspath(db_file))
    if not os.path.isdir(folder):
        raise StorageError(
            f"cannot open queue database {db_file!r}: the folder {folder!r} does not exist; create it first "
            "(persist-queue's SQLite queues do not create it either)"
        )
    return db_file + STORAGE_SUFFIX


class Store:
    """The async core every persist-queue class is built on (the sync classes run it on the engine's loop)."""

    def __init__(
        self,
        root: str,
        table: str,
        serializer: Any,
        *,
        unique: bool = False,
        newest_first: bool = False,
        broker: str | None = None,
        durability: str = "sync",
        prefer_file: bool = False,
    ) -> None:
        self.serializer = _serial.Serializer(serializer, prefer_file)
        self.unique = unique
        self.newest_first = newest_first
        self.broker = broker_address(broker)
        self._memory_dir: str | None = None
        if root == ":memory:":
            if self.broker is not None:
                raise ConfigError("':memory:' queues live in one process; they cannot go through a broker")
            root = self._memory_dir = tempfile.mkdtemp(prefix="persistqueue-memory-")
        self.root = os.path.abspath(root)
        self.table = table
        # Through a broker the broker's storage root holds every topic: the queue's path goes into the name.
        name = table if self.broker is None else f"persistqueue:{self.root}:{table}"
        self.queue = Queue(name, self.root, durability=durability, batch_size=10_000, broker=self.broker)
        self._opened = False
        self._to_clear: list[int] = []
        self.state = State(self.queue, unique)

    async def open(self) -> None:
        if self._opened:
            return
        try:
            await self.queue.open()
        except TopicLockedError as exc:
            raise TopicLockedError(
                f"persist-queue queue {self.table!r} at {self.root} is open in another process; embedded mode "
                f"serves one process. Run a broker (persisting-broker) and pass broker=... or set {BROKER_ENV} to "
                "share a queue between processes safely"
            ) from exc
        self._opened = True
        self.state.embedded = await _engine.embedded(self.queue)

    # -- items ------------------------------------------------------------------------------------------

    async def put(self, item: Any, partition: str = ITEMS, sort_keys: bool = False) -> int | None:
        await self.open()
        blob = await self.serializer.adumps(item, sort_keys=sort_keys or self.unique)
        record: dict[str, Any] = {"data": blob, "ts": time.time()}
        if self.unique:
            record["h"] = hashlib.sha256(blob).digest()
        if self.unique:
            await self.state.write_deferred()  # the put is judged against every state record of what came before it
        (index,) = await self.queue.put_batch([record], partition_id=partition)
        if self.unique:
            await self.state.seen_up_to(index, [record], read=True)
            if index in self.state.duplicates:
                await _engine.mark_consumed(self.queue, partition, TASK, [index])
                return None
        return index + 1

    async def take(
        self,
        *,
        wait: bool,
        timeout: float | None,
        lease: bool,
        pqid: int | None = None,
        after: int | None = None,
        partition: str = ITEMS,
        note: int | None = None,
    ) -> Item | None:
        """The next item for this queue's discipline (or the item ``pqid``, or the next past ``after``).
        ``note``: a state to record of the item taken; through a broker (not Unique: a duplicate taken is no item)
        written in the take's round trip (``Item.noted``), else left to the caller."""
        await self.open()
        picking = pqid is not None or after is not None or self.newest_first
        sampler = None
        if picking:
            order = "newest" if self.newest_first else "oldest"
            sampler = PickSampler(order, None if pqid is None else [pqid - 1], None if after is None else after - 1)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            limit = left if wait and pqid is None else 0.0  # seconds the take may wait (None: for ever)
            taken = await self._take_one(partition, sampler, limit, lease, None if self.unique else note)
            if taken is None:
                return None
            index, blob, ts, noted = taken
            if self.unique:
                if index >= self.state.seen:  # a record is judged by the records below it: those are read already
                    await self.state.catch_up()
                if index in self.state.duplicates:  # a duplicate its putter has not marked yet: drop it, take again
                    if lease:
                        await self.queue.mark_consumed(TASK, [index], partition)
                    continue
            return Item(index + 1, await self.serializer.aloads(blob), ts, noted)

    async def _take_one(
        self, partition: str, sampler: PickSampler | None, limit: float | None, lease: bool, note: int | None = None
    ) -> tuple[int, bytes, float, bool] | None:
        """One take: (global index, the item's bytes now, put time, whether ``note`` was recorded with it), or None
        if nothing came in ``limit`` s."""
        lease_s = UNACK_LEASE_SECONDS if lease else None
        wire_note = None if note is None else self.state.note(note)
        taken = await _engine.take_records(
            self.queue, partition, TASK, limit, sampler, lease_s, ["data", "ts"], note=wire_note
        )
        # embedded: take and rows in one step on the engine loop; a broker: in one request
        records, noted = taken
        if not records:
            return None
        ((index, row),) = records
        if noted is not None and note is not None:
            await self.state.seen_up_to(noted.start, [self.state.noted_record(index, note)])
        return index, bytes(row["data"]), float(row["ts"]), noted is not None

    async def read_item(self, pqid: int, partition: str = ITEMS) -> Item | None:
        """The item's current bytes without taking it (None: no such live item)."""
        rows, _ = await _engine.read_window(self.queue, 1, pqid - 1)
        if not rows or "ts" not in rows[0]:  # none, a state record, or an update's patch row
            return None
        ((blob, ts),) = await self._current([pqid - 1], partition)
        return Item(pqid, await self.serializer.aloads(blob), ts)

    async def _current(
        self, indexes: list[int], partition: str = ITEMS, meta: BatchMeta | None = None
    ) -> list[tuple[bytes, float]]:
        """(bytes, put time) of items now: their latest ``data`` (updates are patches that get_data applies).
        ``meta``: theirs from the take (else the fields are looked up first)."""
        if meta is None:
            bare = BatchMeta(tuple(SampleMeta(i, partition) for i in indexes), {})
            meta = await self.queue.check_ready(bare, ["data", "ts"])
        data = await self.queue.get_data(meta)
        return [(bytes(b), float(t)) for b, t in zip(data["data"], data["ts"], strict=True)]

    async def commit(self, pqids: Sequence[int], partition: str = ITEMS, delete: bool = True) -> None:
        """Consume leased items for good; ``delete``: their rows go too (persist-queue deletes them)."""
        if not pqids:
            return
        indexes = [p - 1 for p in pqids]
        await _engine.mark_consumed(self.queue, partition, TASK, indexes)
        if delete:
            await self.forget(pqids, partition)

    async def forget(
        self, pqids: Sequence[int], partition: str = ITEMS, now: bool = False, lazily: bool = False
    ) -> None:
        """Delete consumed items (in batches). Unique queues record the deletion instead (``lazily``: see
        ``set_status``), see the module doc."""
        if self.unique:
            await self.state.set(pqids, DELETED, lazily)
            return
        self._to_clear.extend(p - 1 for p in pqids)
        if now or len(self._to_clear) >= CLEAR_BATCH_ITEMS:
            await self.flush_deletes(partition)

    async def flush_deletes(self, partition: str = ITEMS) -> None:
        chosen, self._to_clear = self._to_clear, []
        if chosen:
            await self.queue.clear(chosen, partition)

    async def give_back(self, pqids: Sequence[int], partition: str = ITEMS) -> None:
        if pqids:
            await self.queue.give_back(TASK, [p - 1 for p in pqids], partition)

    async def update(self, pqid: int, item: Any) -> None:
        """Replace an item's bytes: a patch of its ``data`` field (the engine reads back the latest write). An id
        that names no live item changes nothing, as persist-queue's UPDATE of no row."""
        await self.open()
        if pqid < 1 or await self.read_item(pqid) is None:
            return
        blob = await self.serializer.adumps(item, sort_keys=self.unique)
        meta = await self._meta_of(pqid)
        await self.queue.put({"data": [blob]}, partition_id=ITEMS, batch_meta=meta)

    async def _meta_of(self, pqid: int) -> BatchMeta:
        return BatchMeta((SampleMeta(pqid - 1, ITEMS),), {})

    # -- counts and state ---------------------------------------------------------------------------------

    async def counts(self, partition: str = ITEMS) -> tuple[int, int]:
        """(items ready to take, items taken and leased)."""
        await self.open()
        info = (await self.queue.partitions()).get(partition)
        if info is None:
            return 0, 0
        task = info["tasks"].get(TASK, {"consumed": 0, "leased": 0})
        return info["samples"] - task["consumed"] - task["leased"], task["leased"]

    async def all_items(self) -> list[tuple[Item, int | None]]:
        """Every live item with its latest state (persist-queue's ``queue()``), in id order."""
        await self.open()
        await self.state.catch_up()
        out: list[tuple[Item, int | None]] = []
        offset = 0
        while True:
            rows, end = await _engine.read_window(self.queue, READ_PAGE_RECORDS, offset)
            if end <= offset:
                return out
            # Cleared rows are skipped by reads: ids come from the mirror's count of item rows per window only
            # when nothing in it was cleared, so ask for each row of such a window on its own.
            if len(rows) == end - offset:
                indexed = list(enumerate(rows, offset))
            else:
                indexed = []
                for index in range(offset, end):
                    one, _ = await _engine.read_window(self.queue, 1, index)
                    if one:
                        indexed.append((index, one[0]))
            live = [
                index
                for index, record in indexed  # items only: state records and updates' patch rows have no "ts"
                if "ts" in record and index not in self.state.duplicates and self.state.status.get(index + 1) != DELETED
            ]
            if live:
                for index, (blob, ts) in zip(live, await self._current(live), strict=True):
                    out.append((Item(index + 1, await self.serializer.aloads(blob), ts), None))
            offset = end

    async def close(self) -> None:
        if self._opened:
            await self.state.write_deferred()
            await self.flush_deletes()
        await self.queue.aclose()
        if self._memory_dir is not None:
            shutil.rmtree(self._memory_dir, ignore_errors=True)
            self._memory_dir = None
