"""The state of a persist-queue queue's items: the ``state`` partition's records and their mirror in memory.

A state record (partition ``state``) is ``sid`` (an item's id) and ``st`` (``AckStatus`` codes; ``DELETED`` for a
row persist-queue would have deleted where the row must stay readable: Unique's, see ``_store``). ``State`` reads
the topic's records in index order into a mirror: the latest state per id and, for the Unique queues, which byte
strings (sha256 ``h`` of the items) are live and which items are duplicates.

Per item at ``durability="sync"`` (persist-queue fsyncs at every put, get and ack) a put is synced, and so is an
ack, ack_failed, nack or task_done (its state record: one fdatasync), and a clear. Recorded lazily (``set_status``:
not synced, and embedded not even written until something reads the state, a Unique put or the close) are the two
state records of a get whose loss changes no outcome: an ack queue's ``UNACK`` with auto_resume (after a crash the
item is ready again with or without it: the lease is gone, ``_resume`` gives back what it names) and a Unique
queue's ``DELETED`` of a consume-on-fetch get (it shares the take's fate: the engine writes a take, syncs it not).
Nothing is decided against a record that could still vanish: the log is one sequence, so a put's sync covers every
record before it, and a Unique put writes the deferred records first. The log and the consumption log may lose
unsynced tails independently and a crash may fall between a take and its record, so an embedded open repairs
what they disagree on (``repair``): an item in a final state (acked, failed, Unique's deleted) that the engine did
not consume is consumed (an acked item is never handed out again); a Unique item consumed without its ``DELETED``
gets one (its bytes are free again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from persisting import Queue

from .. import _engine

ITEMS = "items"
STATE = "state"
TASK = "get"
READY, UNACK, ACKED, ACK_FAILED, DELETED = 1, 2, 5, 9, -1
READ_PAGE_RECORDS = 10_000
NOTE_FIELD = "six"  # a state record written by a broker with a take: the item's global index (its id less one)


class State:
    """The mirror of one queue's state records (read in index order from ``seen`` on), and their writer."""

    def __init__(self, queue: Queue, unique: bool) -> None:
        self.queue = queue
        self.unique = unique
        self.embedded = False  # set at open: no other process writes or reads this topic
        self.seen = 0
        self.status: dict[int, int] = {}  # id -> latest state
        self._live: dict[bytes, int] = {}  # Unique: hash -> id of the live item holding it
        self._hash_of: dict[int, bytes] = {}
        self.duplicates: set[int] = set()  # Unique: global indexes of puts that were duplicates
        self._deferred: dict[int, int] = {}  # embedded: id -> state recorded lazily, not written yet

    async def set(self, pqids: Sequence[int], status: int, lazily: bool = False) -> None:
        """Record a state of items. ``lazily`` (see the module doc for which records): not synced, and embedded
        not even written until something reads the state (``catch_up``), a Unique put or the close; a record
        of the item written before then replaces it."""
        if not pqids:
            return
        if lazily and self.embedded:
            self._deferred.update((p, status) for p in pqids)
            return
        for p in pqids:
            self._deferred.pop(p, None)
        await self._write_status([(p, status) for p in pqids], durable=not lazily)

    async def consume(self, pqids: Sequence[int], status: int) -> None:
        """Consume leased items for good and record their final ``status`` (through a broker in one round trip;
        the record after the consumption, as two steps would)."""
        for p in pqids:
            self._deferred.pop(p, None)
        records = [{"sid": p, "st": status} for p in pqids]
        indexes = [p - 1 for p in pqids]
        written = await _engine.mark_consumed(self.queue, ITEMS, TASK, indexes, then_put=(STATE, records))
        if written is not None:
            await self.seen_up_to(written.start, records)

    @staticmethod
    def note(status: int) -> dict[str, Any]:
        """A take's ``note`` (``_engine.take_records``) that records ``status`` of the item taken: the broker
        writes the item's global index into ``NOTE_FIELD`` (``sid`` is the id, one more)."""
        return {"partition": STATE, "field": NOTE_FIELD, "values": {"st": status}}

    @staticmethod
    def noted_record(index: int, status: int) -> dict[str, Any]:
        """The record the broker wrote for ``note(status)`` of the item at global ``index``."""
        return {NOTE_FIELD: index, "st": status}

    async def write_deferred(self) -> None:
        if self._deferred:
            rows, self._deferred = list(self._deferred.items()), {}
            await self._write_status(rows, durable=False)

    async def _write_status(self, rows: list[tuple[int, int]], durable: bool) -> None:
        records = [{"sid": p, "st": s} for p, s in rows]
        written = await _engine.put_records(self.queue, STATE, records, durable)
        await self.seen_up_to(written.start, records)

    async def seen_up_to(self, first: int, records: list[dict[str, Any]], read: bool = False) -> None:
        """Bring the mirror past ``records``, just written at ``first`` on, when nothing came between (embedded,
        always); else, with ``read``, by reading what did (a reader that needs the state reads it anyway)."""
        if first == self.seen:
            for n, record in enumerate(records):
                self._apply(first + n, record)
            self.seen = first + len(records)
        elif read:
            await self.catch_up()

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
            unrecorded = [i + 1 for i in sorted(done) if i not in self.duplicates and i + 1 in self._hash_of]
            await self.set(unrecorded, DELETED)
            await self.catch_up()

    async def catch_up(self) -> None:
        """Read the records appended since the last look (by any process) into the state mirror."""
        await self.write_deferred()
        while True:
            start = self.seen
            rows, end = await _engine.read_window(self.queue, READ_PAGE_RECORDS, start)
            for n, record in enumerate(rows):
                self._apply(start + n, record)
            self.seen = max(start, end)
            if end < start + READ_PAGE_RECORDS:  # the window stopped at the last record: nothing more to read
                return

    def _apply(self, index: int, record: dict[str, Any]) -> None:
        sid = record.get("sid")
        if sid is None and record.get(NOTE_FIELD) is not None:
            sid = record[NOTE_FIELD] + 1
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
                self.duplicates.add(index)
            else:
                self._live[digest] = index + 1
                self._hash_of[index + 1] = digest
