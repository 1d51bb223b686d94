"""One persist-queue queue on persisting's engine: a topic, its items, takes, and durable per-item state.

Layout of a queue's topic (one topic per persist-queue table, ``<table>_<name>``):

- partition ``items``: one record per ``put``: ``data`` (the serializer's bytes, made in this process), ``ts``
  (time.time() of the put) and, for the Unique queues, ``h`` (sha256 of the bytes). The item's id (persist-queue's
  ``pqid``) is its global index + 1: assigned once by the engine, never reused, so ids from every process agree.
- partition ``state``: one record per state change of an item: ``sid`` (its id) and ``st`` (``AckStatus`` codes;
  ``DELETED`` for a row persist-queue would have deleted where the row must stay readable, see Unique below).
- task ``get`` on ``items``: the consumption cursor. A take is the engine's atomic take (``get_meta``): in the
  broker it is one operation, so two processes never get the same item. Consume-on-fetch where persist-queue
  deletes at ``get``; a lease (``delivery="ack"``) where the item stays the taker's until a commit
  (``mark_consumed``: ack, ``task_done``) or a give-back (``give_back``: nack, rollback of an uncommitted get).
  A lease whose process dies is given back by the broker, so a killed consumer's items are handed out again.

Unique: a put is a duplicate when an earlier item with the same bytes is still live at the put's global index
(not ``DELETED`` by a state record below it). Every process reads the topic in index order, so every process
takes the same decision without a lock: the putter returns None and marks the duplicate taken; a taker that
meets one before that skips it the same way.

What ``durability="sync"`` syncs per item (persist-queue commits, so fsyncs, at every put, get and ack): a put, an
ack / ack_failed / nack / task_done (their state record: one fdatasync of the log), a clear. Not synced, written
only (they survive kill -9): a consume-on-fetch take (the engine's rule: a power loss may hand the last takes out
again), and the two state records that come with a get: an ack queue's ``UNACK`` with ``auto_resume`` (after a
crash its item is ready again whether the record survived or not: ``_resume`` gives back what it names, and the
lease is gone either way) and a Unique queue's ``DELETED`` of a consume-on-fetch get (it shares the take's
fate). The log is one sequence, so a later synced record syncs every earlier one: an acknowledged put is never
decided against a state record that a power loss could still take away. Two files (the log and the consumption
log) may lose their unsynced tails independently, and a kill -9 may fall between a take and its record, so an
embedded open repairs what they disagree on (``repair``): an item with a final state (acked, failed, Unique's
deleted) that the engine has not consumed is consumed (an acked item is never handed out again), and a Unique
item the engine consumed without its ``DELETED`` gets one (its bytes are free again, as after its get).
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

ITEMS = "items"
STATE = "state"
TASK = "get"
READY, UNACK, ACKED, ACK_FAILED, DELETED = 1, 2, 5, 9, -1
# persist-queue's unacked items wait for ever; an engine lease needs an end, so it is made longer than any run.
UNACK_LEASE_SECONDS = 10 * 365 * 24 * 3600.0
READ_PAGE_RECORDS = 10_000
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
        # The state mirror (records read in index order from ``_seen`` on): latest state per id, Unique's live ids.
        self._seen = 0
        self.status: dict[int, int] = {}
        self._live: dict[bytes, int] = {}  # Unique: hash -> id of the live item holding it
        self._hash_of: dict[int, bytes] = {}
        self._duplicates: set[int] = set()
        self._embedded = False  # set at open: no other process writes or reads this topic
        self._deferred: dict[int, int] = {}  # embedded: id -> state recorded lazily, not written yet

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
        self._embedded = await _engine.embedded(self.queue)

    # -- items ------------------------------------------------------------------------------------------

    async def put(self, item: Any, partition: str = ITEMS, sort_keys: bool = False) -> int | None:
        await self.open()
        blob = await self.serializer.adumps(item, sort_keys=sort_keys or self.unique)
        record: dict[str, Any] = {"data": blob, "ts": time.time()}
        if self.unique:
            record["h"] = hashlib.sha256(blob).digest()
        if self.unique:
            await self.write_deferred()  # the put is judged against every state record of what came before it
        (index,) = await self.queue.put_batch([record], partition_id=partition)
        if self.unique:
            await self._seen_up_to(index, [record])
            if index in self._duplicates:
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
    ) -> Item | None:
        """The next item for this queue's discipline (or the item ``pqid``, or the next past ``after``)."""
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
            taken = await self._take_one(partition, sampler, limit, lease)
            if taken is None:
                return None
            index, blob, ts = taken
            if self.unique:
                if index >= self._seen:  # a record is judged by the records below it: those are read already
                    await self.catch_up()
                if index in self._duplicates:  # a duplicate its putter has not marked yet: drop it, take again
                    if lease:
                        await self.queue.mark_consumed(TASK, [index], partition)
                    continue
            return Item(index + 1, await self.serializer.aloads(blob), ts)

    async def _take_one(
        self, partition: str, sampler: PickSampler | None, limit: float | None, lease: bool
    ) -> tuple[int, bytes, float] | None:
        """One take: (global index, the item's bytes now, put time), or None if nothing came in ``limit`` s."""
        lease_s = UNACK_LEASE_SECONDS if lease else None
        records = await _engine.take_records(self.queue, partition, TASK, limit, sampler, lease_s, ["data", "ts"])
        if records is not None:  # embedded: take and rows in one step on the engine loop
            if not records:
                return None
            ((index, row),) = records
            return index, bytes(row["data"]), float(row["ts"])
        meta = await self.queue.get_meta(
            None,
            1,
            TASK,
            partition,
            sampler,
            wait=limit != 0.0,
            timeout=limit,
            delivery="ack" if lease else "fetch",
            lease_seconds=UNACK_LEASE_SECONDS,
        )
        if not meta.global_indexes:
            return None
        # get_data, not a read of the record: an update is a patch of the sample, which only get_data applies.
        ((blob, ts),) = await self._current(meta.global_indexes, partition, meta)
        return meta.global_indexes[0], blob, ts

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
            await self.set_status(pqids, DELETED, lazily)
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

    async def set_status(self, pqids: Sequence[int], status: int, lazily: bool = False) -> None:
        """Record a state of items. ``lazily`` (see the module doc for which records): not synced, and embedded
        not even written until something reads the state (``catch_up``), a Unique put or the close; a record
        of the item written before then replaces it."""
        if not pqids:
            return
        if lazily and self._embedded:
            self._deferred.update((p, status) for p in pqids)
            return
        for p in pqids:
            self._deferred.pop(p, None)
        await self._write_status([(p, status) for p in pqids], durable=not lazily)

    async def write_deferred(self) -> None:
        if self._deferred:
            rows, self._deferred = list(self._deferred.items()), {}
            await self._write_status(rows, durable=False)

    async def _write_status(self, rows: list[tuple[int, int]], durable: bool) -> None:
        records = [{"sid": p, "st": s} for p, s in rows]
        written = await _engine.put_records(self.queue, STATE, records, durable)
        await self._seen_up_to(written.start, records)

    async def _seen_up_to(self, first: int, records: list[dict[str, Any]]) -> None:
        """Bring the mirror past ``records``, just written at ``first`` on: from them, when nothing came between
        (embedded, always), else by reading what did."""
        if first != self._seen:
            await self.catch_up()
            return
        for n, record in enumerate(records):
            self._apply(first + n, record)
        self._seen = first + len(records)

    async def repair(self, ack: bool) -> None:
        """At an embedded open: make the state records and the engine's consumption agree (see the module doc).
        Through a broker the broker keeps the consumption and the layer cannot see it: nothing to do here."""
        done = await _engine.consumed(self.queue, ITEMS, TASK)
        if done is None:
            return
        await self.catch_up()
        # Final states: the engine must have consumed these (a non-Unique queue's DELETED rows are cleared).
        final = ({ACKED, ACK_FAILED} | ({DELETED} if self.unique else set())) if ack else {DELETED}
        lost = sorted(p - 1 for p, s in self.status.items() if s in final and p - 1 not in done)
        if lost:
            await _engine.mark_consumed(self.queue, ITEMS, TASK, lost)
        if self.unique and not ack:
            unrecorded = [i + 1 for i in sorted(done) if i not in self._duplicates and i + 1 in self._hash_of]
            await self.set_status(unrecorded, DELETED)
            await self.catch_up()

    async def catch_up(self) -> None:
        """Read the records appended since the last look (by any process) into the state mirror."""
        await self.write_deferred()
        while True:
            start = self._seen
            rows, end = await _engine.read_window(self.queue, READ_PAGE_RECORDS, start)
            for n, record in enumerate(rows):
                self._apply(start + n, record)
            self._seen = max(start, end)
            if end < start + READ_PAGE_RECORDS:  # the window stopped at the last record: nothing more to read
                return

    def _apply(self, index: int, record: dict[str, Any]) -> None:
        sid = record.get("sid")
        if sid is not None:
            self.status[int(sid)] = int(record["st"])
            if int(record["st"]) == DELETED and self.unique:
                digest = self._hash_of.pop(int(sid), None)
                if digest is not None and self._live.get(digest) == int(sid):
                    del self._live[digest]
            return
        digest = record.get("h")
        if self.unique and isinstance(digest, bytes):
            # Unique queues never clear rows, so a record's position in the reads is its global index.
            if digest in self._live:
                self._duplicates.add(index)
            else:
                self._live[digest] = index + 1
                self._hash_of[index + 1] = digest

    async def all_items(self) -> list[tuple[Item, int | None]]:
        """Every live item with its latest state (persist-queue's ``queue()``), in id order."""
        await self.open()
        await self.catch_up()
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
                if "ts" in record and index not in self._duplicates and self.status.get(index + 1) != DELETED
            ]
            if live:
                for index, (blob, ts) in zip(live, await self._current(live), strict=True):
                    out.append((Item(index + 1, await self.serializer.aloads(blob), ts), None))
            offset = end

    async def close(self) -> None:
        if self._opened:
            await self.write_deferred()
            await self.flush_deletes()
        await self.queue.aclose()
        if self._memory_dir is not None:
            shutil.rmtree(self._memory_dir, ignore_errors=True)
            self._memory_dir = None
