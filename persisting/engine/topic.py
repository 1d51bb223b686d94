"""The engine: one topic's global indexes, write-ahead log, schema, buffering and flushing.

This is the only place where the semantics live; ``Queue`` (embedded) and the broker both drive it. Every
method runs on one event loop (``_loop.engine_loop()`` in embedded mode), so the state below needs no locks:
the steps between two ``await`` are atomic.

On disk, ``<storage_path>/<escaped topic name>/``::

    LOCK            flock'ed by the one process that has the topic open
    topic.json      num_buckets, bucket_column, backend (fixed at creation; a mismatch is a ConfigError)
    schema.json     field -> kind, written before the log is trimmed (frames carry new kinds until then)
    state.json      flushed_upto: every index below it is in the backends
    wal/            the write-ahead log (see wal.py)
    bucket-<i>...   one backend per bucket (LanceBackend: bucket-<i>.lance)

Life of a put: validate and encode (caller's thread) -> assign indexes and write one log frame (atomic on the
loop) -> group commit (one fdatasync for every waiting put) -> visible to readers -> acknowledged. A flush later
moves visible rows into the backends, advances ``flushed_upto``, and drops log segments below it. Rows whose
index is not above the largest index already in their bucket are skipped, so replaying a log whose flush had
landed (a Lance commit can land without its writer knowing) stores nothing twice.

Bucket of a row: crc32 of the canonical bytes of ``row[bucket_column]`` modulo ``num_buckets``; a row without
that key (or with ``None``) goes to ``global_index % num_buckets``. Exception: the samples of one tensor batch
that went through the broker's arena, when none has the bucket column, go to one bucket together
(``layout.batch_bucket`` of the batch's first index), so its payload is written as whole columns.

Beside this module, mixins of Topic: ``opening.py`` (lock, settings, recovery), ``flushing.py`` (tail ->
backends, and when), ``samples.py`` (the partition index, consume-on-fetch and leases; its base
``sample_data.py``: where fields lie) and ``partitions.py`` (listing, clear, tags, purge); ``tail.py`` holds the
chunks waiting for a flush, arena batches among them.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (
    ConfigError,
    QueueClosedError,
    SchemaConflictError,
)
from ..queue.backend import StorageBackend
from ..wire.codec import INDEX_KEY, EncodedBatch
from .config import Metrics, TopicConfig
from .consumption import ConsumptionLog
from .fields import FieldIndex
from .flushing import Flushing, WriteBehind
from .gate import ReadGate
from .layout import IndexColumn, topic_dirname, write_json_atomic
from .location import ObjectStoreTopic
from .opening import ArenaResolver, Opening
from .partitions import Partitions
from .runs import PartitionIndex
from .samples import Consumption, Samples
from .tail import ArenaPayload, Chunk
from .wal import WriteAheadLog

log = logging.getLogger(__name__)

IDEMPOTENCY_KEYS_KEPT = 65_536  # recent put_batch keys remembered for retries (in memory and in unflushed frames)

BackendFactory = Callable[..., StorageBackend]


class Topic(Opening, Flushing, Samples, Partitions):
    def __init__(
        self,
        name: str,
        storage_path: Path,
        config: TopicConfig,
        backend: BackendFactory,
        *,
        arena_resolver: ArenaResolver | None = None,
        on_flushed: Callable[[str, int], None] | None = None,
        remote: ObjectStoreTopic | None = None,
    ) -> None:
        self.name = name
        self._remote = remote  # the object-store side (location.py), None for a local topic
        self._arena_resolver = arena_resolver
        self._on_flushed = on_flushed
        # partition -> its global indexes in order, as runs (built on first use)
        self._partitions: dict[str, PartitionIndex] | None = None
        # Patches appended but not yet acknowledged, in index order: they count (readiness, the row a field is
        # read from) only once visible, so no sample is handed out with a field that a crash could still lose.
        self._pending_patches: collections.deque[Chunk] = collections.deque()
        self._fields = FieldIndex()  # own fields and patches of the samples (fields.py), built with _partitions
        self._consumption: dict[tuple[str, str], Consumption] = {}  # (partition, task) -> what it has taken
        self._consumption_log: ConsumptionLog | None = None
        self._cleared: set[int] = set()  # samples deleted by clear() (partitions.py)
        self._cleared_in: dict[str, set[int]] = {}  # the same, per partition
        self._tags: dict[int, dict[str, Any]] = {}  # global index -> the sample's tags (partitions.py)
        self._rank_cache: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._take_keys: OrderedDict[str, list[int]] = OrderedDict()  # a take's request key -> its batch
        self.config = config
        self.path = storage_path / topic_dirname(name)
        self._factory = backend if remote is None else remote.backend(backend)
        self.backend_name = getattr(backend, "__qualname__", type(backend).__qualname__)
        self.kinds: dict[str, str] = {}
        self.next_index = 0
        self.visible_upto = 0  # every index below is acknowledged and readable
        self.flushed_upto = 0  # every index below is in the backends
        self.metrics = Metrics()
        self._backends: list[StorageBackend] = []
        self._columns: list[IndexColumn] = []
        self._tail: list[Chunk] = []
        self._tail_firsts: list[int] = []
        self._resident: list[Chunk] = []  # flushed arena batches whose extents are still mapped, by index
        self._resident_firsts: list[int] = []
        self._wal: WriteAheadLog | None = None
        self._lock_fd: int | None = None
        self._closed = False
        self._changed = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flush_wanted = asyncio.Event()
        self._stopping = False
        self._stop_requested = asyncio.Event()
        self._urgent = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._flush_error: BaseException | None = None
        self._durable_backend = True
        self._write_behind = WriteBehind()  # when arena batches are flushed (flushing.py)
        self._rearm = asyncio.Event()
        self._recent: OrderedDict[str, tuple[int, int]] = OrderedDict()  # idempotency key -> (first, count)
        self._kinds_written: dict[str, str] = {}
        self._read_gate = ReadGate()  # reads of backend positions share it; a purge takes it alone
        self._unpurged: set[int] = set()  # cleared samples whose rows may still be in the backends
        self._last_purge = 0.0  # time.monotonic() of the last purge

    # -- writing ------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosedError(f"topic {self.name!r} is closed")

    def _add_chunk(
        self,
        first: int,
        partition: str,
        rows: list[dict[str, Any]],
        arena: ArenaPayload | None = None,
        whole: bool = False,
        patch: tuple[list[int], list[str]] | None = None,
    ) -> None:
        chunk = Chunk(first, partition, rows, arena, whole, patch)
        self._tail.append(chunk)
        if arena is not None:
            arena.used = True
        self._tail_firsts.append(first)
        if self._partitions is not None and rows:
            self._index_chunk(chunk)

    def _index_chunk(self, chunk: Chunk) -> None:
        """Add a chunk to the partition index: its samples, or a patch's writes (see fields.py)."""
        if self._partitions is None:
            return
        if chunk.of is not None:
            self._pending_patches.append(chunk)
            self._apply_visible_patches()
            return
        index = self._partitions.get(chunk.partition)
        if index is None:
            index = self._partitions[chunk.partition] = PartitionIndex()
        index.append(chunk.first, chunk.count)
        # What Chunk.own_fields_id gives each row, as runs: one step for a put whose rows share their fields.
        extra = tuple(chunk.arena.columns) if chunk.arena is not None else ()
        self._fields.add_runs(chunk.partition, self._fields.rows_ids(chunk.other, extra))

    def _apply_visible_patches(self) -> None:
        """Count the pending patches that are acknowledged now (in index order, so the latest write wins)."""
        pending = self._pending_patches
        while pending and pending[0].first + pending[0].count <= self.visible_upto:
            chunk = pending.popleft()
            if chunk.of is not None:
                self._fields.patch(chunk.first, chunk.of, chunk.patch_fields)

    async def _check_targets(self, partition: str, targets: list[int], n: int) -> None:
        """The samples a patch writes to must be acknowledged samples of its partition, each named once."""
        if len(targets) != n:
            raise ConfigError(f"this put writes {n} samples but its batch_meta names {len(targets)}")
        if len(set(targets)) != len(targets):
            raise ConfigError("a batch_meta names the same sample twice; one put writes a sample's fields once")
        why = ": a put with batch_meta writes fields of samples that exist (pass the BatchMeta of put or get_meta)"
        await self.check_in_partition(partition, targets, why)
        self.check_not_cleared(targets)

    async def append(
        self,
        batch: EncodedBatch,
        partition: str,
        rows_blob: bytes,
        key: str | None = None,
        arena: ArenaPayload | None = None,
        of: list[int] | None = None,
    ) -> tuple[int, int]:
        """Store encoded rows durably; returns (first global index, count) once acknowledged.

        ``key`` makes a retry idempotent: a batch whose key was stored already (even before a restart: the key
        travels in its log frame) is not stored again, and the first result is returned.

        ``of``: a patch. Row k writes its fields for the existing sample ``of[k]`` of ``partition`` (see
        fields.py); the rows get indexes of their own, which are not samples.
        """
        self._check_open()
        patch = None
        if of is not None:
            patch = (list(of), sorted(batch.kinds))
            await self._check_targets(partition, patch[0], len(batch.rows))
        if key is not None and key in self._recent:
            if self._wal is not None:
                await self._wal.commit()  # the first attempt may still be waiting for its sync
            return self._recent[key]
        wal = self._wal
        if wal is None:
            raise QueueClosedError(f"topic {self.name!r} is not open")
        if self._stopping:  # close() takes what is in the log when it starts, and nothing after
            raise QueueClosedError(f"topic {self.name!r} is closing")
        new_kinds: dict[str, str] = {}
        for field_name, kind in batch.kinds.items():
            stored = self.kinds.get(field_name)
            if stored is None:
                new_kinds[field_name] = kind
            elif stored != kind:
                raise SchemaConflictError(field_name, stored, kind)
        n = len(batch.rows)
        if n == 0:
            return self.next_index, 0
        first = self.next_index
        # From here to the commit nothing awaits: indexes, kinds and the frame land together.
        header: list[Any] = [partition, new_kinds, key]
        if arena is not None or patch is not None:
            header.append(None if arena is None else arena.ref)
        if patch is not None:
            header.append([patch[0], patch[1]])
        wal.append(first, n, header, rows_blob)
        if key is not None:
            self._remember(key, first, n)
        self.kinds.update(new_kinds)
        self.next_index = first + n
        self._add_chunk(first, partition, batch.rows, arena, patch=patch)
        t0 = time.perf_counter()
        await wal.commit()
        self.metrics.commit_seconds += time.perf_counter() - t0
        if first + n > self.visible_upto:
            self.visible_upto = first + n
            self._apply_visible_patches()
            self._changed.set()
            self._changed = asyncio.Event()
        self.metrics.puts += 1
        self.metrics.records_put += n
        if arena is not None:
            self.arena_put()
        elif self.visible_upto - self.flushed_upto >= self.config.batch_size:
            self._flush_wanted.set()
        return first, n

    async def recall(self, key: str) -> tuple[int, int] | None:
        """The result of the put_batch stored under ``key`` (once acknowledged), or None if there was none."""
        found = self._recent.get(key)
        if found is not None and self._wal is not None:
            await self._wal.commit()  # the first attempt may still be waiting for its sync
        return found

    def _remember(self, key: str, first: int, n: int) -> None:
        self._recent[key] = (first, n)
        if len(self._recent) > IDEMPOTENCY_KEYS_KEPT:
            self._recent.popitem(last=False)

    # -- reading ------------------------------------------------------------------------------------

    def count(self) -> int:
        return self.visible_upto

    async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Rows with global index in [offset, offset+limit), in index order, and the kinds to decode them."""
        rows, kinds, _end = await self.read_window(offset, limit)
        return rows, kinds

    async def read_window(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """``read``, and where the window ended: the next read starts there (rows of cleared samples are skipped,
        so a window may hold fewer rows than it spans)."""
        self._check_open()
        async with self._read_gate.reading():  # a purge deleting rows (positions moving) waits for this read
            return await self._read_window(offset, limit)

    async def _read_window(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        lo, hi = offset, min(offset + limit, self.visible_upto)
        if lo >= hi:
            return [], dict(self.kinds), lo
        flushed = self.flushed_upto
        kinds = dict(self.kinds)
        cleared = self._cleared
        # Snapshot the tail now: a flush may move it into the backends while we await them.
        tail_rows: list[dict[str, Any]] = []
        if hi > flushed:
            start = max(lo, flushed)
            k = max(0, bisect.bisect_right(self._tail_firsts, start) - 1)
            for chunk in self._tail[k:]:
                if chunk.first >= hi:
                    break
                a = max(start - chunk.first, 0)
                b = min(hi - chunk.first, len(chunk.rows))
                if a < b and cleared:
                    tail_rows.extend(r for i, r in enumerate(chunk.rows[a:b], chunk.first + a) if i not in cleared)
                elif a < b:
                    tail_rows.extend(chunk.rows[a:b])
        stored: list[dict[str, Any]] = []
        if lo < flushed:
            top = min(hi, flushed)
            plans = []
            for b, col in enumerate(self._columns):
                view = col.view()
                p0 = int(np.searchsorted(view, lo, "left"))
                p1 = int(np.searchsorted(view, top, "left"))
                if p1 > p0:
                    plans.append((b, p0, p1))
            parts = await asyncio.gather(*(self._backends[b].get(p1 - p0, p0) for b, p0, p1 in plans))
            merged: list[tuple[int, dict[str, Any]]] = []
            for part in parts:
                merged.extend((row[INDEX_KEY], row) for row in part)
            merged.sort(key=lambda pair: pair[0])
            stored = [row for i, row in merged if i not in cleared] if cleared else [row for _, row in merged]
        self.metrics.gets += 1
        self.metrics.records_read += len(stored) + len(tail_rows)
        return stored + tail_rows, kinds, hi

    async def wait_beyond(self, index: int, timeout: float | None) -> bool:
        """Wait until a record with global index >= ``index`` is visible; False on timeout."""
        while self.visible_upto <= index:
            self._check_open()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return self.visible_upto > index
        return True

    async def stats(self) -> dict[str, Any]:
        buckets = []
        for backend in self._backends:
            buckets.append(await backend.stats())
        wal = self._wal
        out: dict[str, Any] = {
            "name": self.name,
            "path": str(self.path),
            "total_count": self.visible_upto,
            "next_index": self.next_index,
            "flushed": self.flushed_upto,
            "buffered": self.visible_upto - self.flushed_upto,
            "num_buckets": self.config.num_buckets,
            "bucket_column": self.config.bucket_column,
            "durability": self.config.durability,
            "backend": self.backend_name,
            "fields": dict(self.kinds),
            "wal_bytes": await asyncio.to_thread(wal.size_bytes) if wal is not None else 0,
            "buckets": buckets,
        }
        if self._flush_error is not None:
            out["last_flush_error"] = repr(self._flush_error)
        return out

    # -- closing ------------------------------------------------------------------------------------

    async def close_quietly(self) -> None:
        """Release files after a failed open, without flushing."""
        self._closed = self._stopping = True
        if self._wal is not None:
            with contextlib.suppress(Exception):
                await self._wal.close()
            self._wal = None
        if self._consumption_log is not None:
            with contextlib.suppress(Exception):
                self._consumption_log.close()
            self._consumption_log = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._remote is not None:
            await asyncio.to_thread(self._remote.detach)

    async def _acknowledge_logged(self) -> None:
        """At close: rows already in the log count as acknowledged (a reopen would replay them anyway), so the
        last flush takes them too. A put still waiting for its sync when close began would otherwise stay in the
        log alone, and a broker removes its arena after a clean stop: the replay would find its tensors gone."""
        if self._wal is not None and self.visible_upto < self.next_index:
            await self._wal.commit()
            self.visible_upto = self.next_index
            self._apply_visible_patches()

    async def close(self) -> None:
        if self._closed:
            return
        # Stop the background flusher between iterations, never inside one: cancelling an await on a worker
        # thread would leave Lance writing (a compaction, say) after the lock is released.
        self._stopping = True
        self._stop_requested.set()
        self._urgent.set()
        self._flush_wanted.set()
        try:
            if self._flusher is not None:
                await asyncio.shield(self._flusher)
            await self._acknowledge_logged()
            await self._flush_once()
            if self._unpurged:  # every row is flushed now: the cleared ones leave Lance before the files close
                await self._purge_now()
            if self._durable_backend:  # a reopen then skips the log's flushed frames without decoding them
                await asyncio.to_thread(
                    write_json_atomic, self.path / "state.json", {"flushed_upto": self.flushed_upto}
                )
        finally:
            self._closed = True
            self._changed.set()
            for backend in self._backends:
                aclose = getattr(backend, "aclose", None)
                if aclose is not None:
                    try:
                        await aclose()
                    except Exception:  # the log still holds every row; the files must be released regardless
                        log.exception("closing a backend of topic %r failed", self.name)
            if self._wal is not None:
                await self._wal.close()
                self._wal = None
            if self._consumption_log is not None:
                self._consumption_log.close()
                self._consumption_log = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None
            if self._remote is not None:  # after the last write: another node may take the topic now
                await asyncio.to_thread(self._remote.detach)
