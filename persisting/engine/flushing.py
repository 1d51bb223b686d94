"""Flushing a topic: moving acknowledged rows from the tail (and the write-ahead log) into the backends.

``Flusher`` is composed into ``topic.Topic``, on the engine's loop. One flush at a time (the
flush lock): it takes every visible chunk of the tail, decides each row's bucket (here, once per row, not on the
put path), writes each bucket's rows in parallel (tensor fields as typed Arrow columns; those of an arena batch
without the bucket column built over its shared memory, no copy), then, in one loop step, drops the chunks from
the tail and advances ``flushed_upto``: a reader sees a row in the tail or in a backend, never in neither. Only
then are log segments below the cut dropped (schema.json and state.json written first).

A bucket whose write fails is reopened from what is on disk (a Lance commit can land and still raise); rows whose
index is not above the largest the bucket holds are skipped, so the retry stores exactly what is missing.

Scheduling: a background loop flushes when ``batch_size`` rows wait or ``auto_flush_interval_sec`` passed,
spaced at least ``MIN_FLUSH_SPACING_SECONDS`` apart and at most a quarter of the time; ``flush()``, ``close()``
and a filling arena (``flush_soon``) do not wait for the spacing.

Arena batches are written behind (``WriteBehind``): their payload already outlives every process in the arena, so
a flush of them waits until the topic has had no arena put for ``WRITE_BEHIND_IDLE_SECONDS``, the oldest has
waited ``WRITE_BEHIND_MAX_SECONDS`` (the window a machine restart could lose), or the arena fills (the broker calls
``flush_soon``). Writing tensors to Lance costs a core for about 2 s per GB on the reference machine: done during
a stream of hand-overs, it takes the cores the hand-overs need.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..wire.codec import FIELDS_KEY, INDEX_KEY, OF_KEY, PARTITION_KEY
from .buckets import Buckets
from .config import Metrics, TopicConfig
from .fields import FieldIndex
from .index import SampleIndex
from .layout import batch_bucket, bucket_of, write_json_atomic
from .location import ObjectStoreTopic
from .schema import Schema
from .tail import Chunk, Tail, whole_batch
from .wal import ROTATE_AT_BYTES, WriteAheadLog

log = logging.getLogger(__name__)

# Background flushes start at most this often (flush(), close() and arena pressure do not wait for it).
MIN_FLUSH_SPACING_SECONDS = float(os.environ.get("PERSISTING_MIN_FLUSH_SPACING", "0.25"))
# ... and, when flushes are slow (megabytes of tensor payload to disk), at most a quarter of the time: the
# rest belongs to hand-overs. The arena asks for a flush sooner when it fills (flush_soon).
FLUSH_DUTY_FACTOR = 3.0
# Arena batches: a flush once the topic had no arena put for this long, or its oldest waited that long (see above).
WRITE_BEHIND_IDLE_SECONDS = float(os.environ.get("PERSISTING_WRITE_BEHIND_IDLE", "0.1"))
WRITE_BEHIND_MAX_SECONDS = float(os.environ.get("PERSISTING_WRITE_BEHIND_MAX", "5.0"))
# ... and such a flush goes in steps of this much payload (~0.13 s of Lance's encoding at the default)
WRITE_BEHIND_STEP_BYTES = int(os.environ.get("PERSISTING_WRITE_BEHIND_STEP_BYTES", str(64 * 1024 * 1024)))
# Flushed log segments are kept this long so that a put retried across a broker restart is recognized by
# its key (clients give up after PERSISTING_REQUEST_TIMEOUT, 30 s by default).
IDEMPOTENCY_WINDOW_SECONDS = 120.0


class WriteBehind:
    """When a topic's arena batches are due for a flush: the times of its oldest unflushed and latest arena put."""

    __slots__ = ("latest", "oldest")

    def __init__(self) -> None:
        self.oldest: float | None = None
        self.latest = 0.0

    def put(self, now: float) -> bool:
        """An arena batch was put at ``now``; True if it is the first one waiting (the loop must look again)."""
        first = self.oldest is None
        if first:
            self.oldest = now
        self.latest = now
        return first

    def due(self, now: float) -> float | None:
        """Seconds until a flush is due (0: now), or None when no arena batch waits."""
        if self.oldest is None:
            return None
        return max(0.0, min(self.latest + WRITE_BEHIND_IDLE_SECONDS, self.oldest + WRITE_BEHIND_MAX_SECONDS) - now)

    def flushed(self, started: float, left: bool) -> None:
        """A flush that began at ``started`` is done; ``left``: arena batches put since then still wait."""
        self.oldest = started if left else None


class Housekeeping(Protocol):
    """Work the flush loop also schedules (the purge of cleared rows, partitions.Clears), and the cleared samples
    (a chunk whose samples are all cleared is not written: its clear is logged, nothing can read it)."""

    @property
    def cleared(self) -> set[int]: ...

    def wait(self) -> float | None: ...

    async def run_if_due(self) -> None: ...


class Flusher:
    """Moves the tail into the backends, and decides when; owns the flush lock's schedule and the loop."""

    def __init__(
        self,
        name: str,
        path: Path,
        config: TopicConfig,
        tail: Tail,
        buckets: Buckets,
        index: SampleIndex,
        schema: Schema,
        metrics: Metrics,
        lock: asyncio.Lock,
        housekeeping: Housekeeping,
        on_flushed: Callable[[str, int], None] | None = None,
        remote: ObjectStoreTopic | None = None,
    ) -> None:
        self._name = name
        self._path = path
        self._config = config
        self._tail = tail
        self._buckets = buckets
        self._index = index
        self._schema = schema
        self._metrics = metrics
        self._flush_lock = lock  # shared with the sample index's build and the purge: one of them at a time
        self._housekeeping = housekeeping
        self._on_flushed = on_flushed
        self._remote = remote  # an object-store topic: the schema is published there before rows that need it
        self._wal: WriteAheadLog | None = None
        self._flush_wanted = asyncio.Event()
        self._urgent = asyncio.Event()
        self._rearm = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None  # the last background flush's failure, until one succeeds
        self._write_behind = WriteBehind()

    def start(self, wal: WriteAheadLog) -> None:
        """Flush through ``wal`` from now on (dropping its segments below each cut)."""
        self._wal = wal

    def run(self) -> None:
        """Start the background loop (at the end of open)."""
        self._loop_task = asyncio.ensure_future(self._flush_loop())

    async def stop(self) -> None:
        """Stop the background loop between iterations, never inside one: cancelling an await on a worker thread
        would leave Lance writing (a compaction, say) after the topic's lock is released."""
        self._stopping = True
        self._stop_requested.set()
        self._urgent.set()
        self._flush_wanted.set()
        if self._loop_task is not None:
            await asyncio.shield(self._loop_task)

    def want(self) -> None:
        """A flush (or housekeeping) is due: the loop starts it at its next opportunity."""
        self._flush_wanted.set()

    async def _flush_loop(self) -> None:
        interval = self._config.auto_flush_interval_sec or None
        while not self._stopping:
            due = [w for w in (self._housekeeping.wait(), self._write_behind.due(time.monotonic())) if w is not None]
            wait = min([*due, interval]) if interval is not None else (min(due) if due else None)
            woke = await self._sleep(wait)
            if self._stopping:
                return
            if woke == "rearm" or (woke == "timeout" and wait != interval and not self._work_due()):
                continue  # an arena batch came (its flush is due later), or a later put moved that moment
            # Written behind (nothing asked for this flush): in steps, so a stream that resumes waits one step.
            behind = woke == "timeout" and wait != interval and self._write_behind.due(time.monotonic()) == 0.0
            self._flush_wanted.clear()
            if self._stopping:
                return
            try:
                started = time.monotonic()
                await self.flush_once(WRITE_BEHIND_STEP_BYTES if behind else None)
                await self._buckets.maintain()
                await self._housekeeping.run_if_due()
                self.error = None
                if behind:
                    continue  # the next step comes at once while the topic stays quiet
                # Under a steady stream, space background flushes out: every flush costs one Lance commit per
                # bucket (~5 ms of CPU each) whatever its size, and the log already keeps the rows durable.
                took = time.monotonic() - started
                spacing = max(MIN_FLUSH_SPACING_SECONDS, FLUSH_DUTY_FACTOR * took)
                rest = started + spacing - time.monotonic()
                if rest > 0 and not self._urgent.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._urgent.wait(), rest)
                self._urgent.clear()
            except Exception as exc:  # kept for stats(); the next flush() retries and raises it
                if isinstance(exc, RuntimeError) and "shutdown" in str(exc):
                    # The interpreter is exiting with the topic still open (its worker threads are gone): nothing
                    # can be flushed any more, and the log keeps every acknowledged row for the next open.
                    log.debug("topic %r left open at exit; its log keeps what was not flushed", self._name)
                    return
                log.exception("background flush of topic %r failed; will retry", self._name)
                self.error = exc
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_requested.wait(), 1.0)

    async def _sleep(self, seconds: float | None) -> str:
        """Until a flush is wanted ("wanted"), the first arena batch in a while came ("rearm"), or ``seconds``
        passed ("timeout")."""
        waits = {
            asyncio.ensure_future(self._flush_wanted.wait()): "wanted",
            asyncio.ensure_future(self._rearm.wait()): "rearm",
        }
        try:
            done, _pending = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        self._rearm.clear()
        if any(waits[w] == "wanted" for w in done) or self._flush_wanted.is_set():
            return "wanted"
        return "rearm" if done else "timeout"

    def _work_due(self) -> bool:
        return self._housekeeping.wait() == 0.0 or self._write_behind.due(time.monotonic()) == 0.0

    def arena_put(self) -> None:
        """An arena batch was appended: written behind (see the module docstring), not at ``batch_size``."""
        if self._write_behind.put(time.monotonic()):
            self._rearm.set()

    def flush_soon(self) -> None:
        """Start a background flush now, without the usual spacing (the arena needs the space)."""
        self._urgent.set()
        self._flush_wanted.set()

    async def flush(self) -> None:
        """Return once every record acknowledged before this call is stored in the backends."""
        await self.flush_once()
        self._flush_wanted.set()  # housekeeping (compaction, cleanup) follows in the background

    async def flush_once(self, step_bytes: int | None = None) -> None:
        """Flush every visible chunk; ``step_bytes``: only the oldest ones, up to about that much arena payload."""
        async with self._flush_lock:
            tail = self._tail
            cut = tail.visible_upto
            if cut <= tail.flushed_upto:
                return
            wal = self._wal
            if wal is None:
                return
            if step_bytes is not None:
                cut = tail.step_cut(cut, step_bytes)
            t0 = time.perf_counter()
            started = time.monotonic()
            if wal.current_bytes() >= ROTATE_AT_BYTES:
                wal.rotate(tail.next_index)
            chunks = tail.below(cut)
            buckets = self._buckets
            per_bucket: list[list[dict[str, Any]]] = [[] for _ in range(len(buckets))]
            per_index: list[list[int]] = [[] for _ in range(len(buckets))]
            # per bucket: (position in its rows, arena batch, samples skipped) for batches written as columns
            per_arena: list[list[tuple[int, Chunk, int]]] = [[] for _ in range(len(buckets))]
            col, n = self._config.bucket_column, self._config.num_buckets
            columnar = buckets.columnar
            fields = self._index.fields
            # Chunks cleared before their flush (a step's data in RL) are never written, so never purged either.
            cleared = self._housekeeping.cleared
            live = [c for c in chunks if not (cleared and _all_cleared(c, cleared))]
            whole = {id(c) for c in live if whole_batch(c, col)}
            slow = [c for c in live if c.arena is not None and not (columnar and id(c) in whole)]
            if slow:
                # Encoding tensor samples copies megabytes: off the loop, so hand-overs go on meanwhile.
                await asyncio.to_thread(lambda: [c.rows for c in slow])
            for chunk in live:
                batch_b = batch_bucket(chunk.first, n) if id(chunk) in whole else None
                if chunk.arena is not None and columnar and batch_b is not None:
                    # A tensor batch without the bucket column goes to one bucket whole, so its payload is
                    # written as columns straight from the arena (no Python object per sample).
                    b = batch_b
                    skip = max(0, buckets.last(b) - chunk.first + 1)
                    if skip < chunk.count and chunk.of is None and not any(chunk.other[skip:]):
                        # Tensors only (the usual batch): every row carries the same engine columns but its index.
                        per_arena[b].append((len(per_bucket[b]), chunk, skip))
                        names = fields.to_json(chunk.own_fields_id(skip, fields))
                        indexes = range(chunk.first + skip, chunk.first + chunk.count)
                        partition = chunk.partition
                        per_bucket[b].extend(
                            {INDEX_KEY: i, PARTITION_KEY: partition, FIELDS_KEY: names} for i in indexes
                        )
                        per_index[b].extend(indexes)
                    elif skip < chunk.count:
                        per_arena[b].append((len(per_bucket[b]), chunk, skip))
                        for i in range(skip, chunk.count):
                            out = dict(chunk.other[i])
                            out[INDEX_KEY] = chunk.first + i
                            out[PARTITION_KEY] = chunk.partition
                            _mark_fields(out, chunk, i, fields)
                            per_bucket[b].append(out)
                            per_index[b].append(chunk.first + i)
                    continue
                # Buckets are decided here, once per row, not on the put path.
                for i, row in enumerate(chunk.rows):
                    index = chunk.first + i
                    b = batch_b if batch_b is not None else bucket_of(row.get(col), index, n)
                    if index <= buckets.last(b):
                        continue  # already stored by a flush whose completion was not recorded
                    out = dict(row)
                    out[INDEX_KEY] = index
                    out[PARTITION_KEY] = chunk.partition
                    _mark_fields(out, chunk, i, fields)
                    per_bucket[b].append(out)
                    per_index[b].append(index)
            kinds = self._schema.kinds
            if self._remote is not None:  # the schema reaches the object store before rows that need it
                await asyncio.to_thread(self._remote.publish_kinds, dict(kinds))
            results = await asyncio.gather(
                *(
                    buckets.write(b, rows, per_index[b], per_arena[b], kinds)
                    for b, rows in enumerate(per_bucket)
                    if rows
                ),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            # One loop step: readers see the rows either in the tail or in the backends, never neither.
            tail.flushed(chunks, cut)
            self._write_behind.flushed(started, tail.has_arena())
            if buckets.durable:
                await asyncio.to_thread(self._persist_progress, wal, cut)
                stored = [c.arena.on_stored for c in chunks if c.arena is not None and c.arena.on_stored is not None]
                if stored:  # spool files (spooled.py): replay must skip their frames before the files go
                    await asyncio.to_thread(write_json_atomic, self._path / "state.json", {"flushed_upto": cut})
                    for done in stored:
                        done()
            if self._on_flushed is not None:
                self._on_flushed(self._name, cut)
            self._metrics.flushes += 1
            self._metrics.records_flushed += sum(len(x) for x in per_index)
            self._metrics.flush_seconds += time.perf_counter() - t0

    def _persist_progress(self, wal: WriteAheadLog, cut: int) -> None:
        # Before any frame leaves the log: the kinds it carried go to schema.json, and state.json records what
        # is in the backends (the start-up floor for indexes and the point replay can skip to).
        self._schema.save(self._path / "schema.json")
        segments = wal.droppable(cut, IDEMPOTENCY_WINDOW_SECONDS)
        if segments:
            write_json_atomic(self._path / "state.json", {"flushed_upto": cut})
            wal.drop(segments)


def _all_cleared(chunk: Chunk, cleared: set[int]) -> bool:
    """Whether every sample ``chunk`` holds (or, a patch, writes to) is cleared."""
    targets = chunk.of if chunk.of is not None else range(chunk.first, chunk.first + chunk.count)
    return all(i in cleared for i in targets)


def _mark_fields(out: dict[str, Any], chunk: Chunk, i: int, fields: FieldIndex) -> None:
    """The engine columns a stored row carries so that the field index can be rebuilt at open."""
    if chunk.of is not None:
        out[OF_KEY] = chunk.of[i]
        out[FIELDS_KEY] = fields.to_json(fields.intern(frozenset(chunk.patch_fields)))
    else:
        out[FIELDS_KEY] = fields.to_json(chunk.own_fields_id(i, fields))
