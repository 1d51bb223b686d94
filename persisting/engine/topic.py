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

A put is acknowledged once its log frame is committed (puts.py); a flush later moves visible rows into the backends
(flushing.py, buckets decided by layout.bucket_of), advances ``flushed_upto`` and drops log segments below it. Rows
whose index is not above the largest index already in their bucket are skipped, so replaying a log whose flush had
landed (a Lance commit can land without its writer knowing) stores nothing twice.

Topic is composed of parts, each the one owner of its state, each given the others it uses::

    Topic ── lifecycle (open, close) and the interface (engine/__init__.py)
     ├─ Appender     puts.py        the put path: indexes, log frame, group commit, retried puts' keys
     ├─ Tail         tail.py        chunks waiting for a flush, resident arena batches, the index marks
     ├─ Buckets      buckets.py     one backend per bucket and its index column
     ├─ Schema       schema.py      field -> kind
     ├─ SampleIndex  index.py       partitions as runs of indexes, fields of each sample (built on first use)
     ├─ Clears       partitions.py  cleared samples, tags, the purge (with the read gate)
     │   └─ PayloadRefs payloads.py  which payload rows of deduped fields are live, and their references
     ├─ Reader       reader.py      rows by index; where a sample's fields lie (tail, arena, backends)
     ├─ Describer    describing.py  samples' field kinds, dtypes, shapes and tags (get_meta), from the Reader
     ├─ Takes        takes.py       consume-on-fetch, leases, samplers (the consumption log, with Clears)
     ├─ Flusher      flushing.py    tail -> backends, and when (write-behind of arena batches)
     └─ KeyIndex     keys.py        which sample each (partition, key) names (``keys``, public)
    opening.py: lock, settings, recovery (open_files, replay), called by ``open``

The flush lock is shared by the Flusher, the SampleIndex's build and the purge: each needs the tail and the backends to
hold still.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import QueueClosedError
from ..storage.backend import StorageBackend
from ..tensors.arena import Peer
from ..wire.codec import EncodedBatch
from . import opening
from .buckets import Buckets
from .config import Metrics, TopicConfig
from .consumption import ConsumptionLog
from .describing import Describer
from .fields import FieldIndex
from .flushing import Flusher
from .index import SampleIndex
from .keys import KeyIndex
from .layout import topic_dirname, write_json_atomic
from .location import ObjectStoreTopic
from .opening import ArenaResolver
from .partitions import Clears
from .puts import Appender
from .reader import Reader
from .samplers import Sampler
from .schema import Schema
from .tail import ArenaPayload, Tail
from .takes import Takes
from .wal import WriteAheadLog

log = logging.getLogger(__name__)

BackendFactory = Callable[..., StorageBackend]


class Topic:
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
        self.config = config
        self.path = storage_path / topic_dirname(name)
        self.backend_name = getattr(backend, "__qualname__", type(backend).__qualname__)
        self._remote = remote  # the object-store side (location.py), None for a local topic
        self.metrics = Metrics()
        self._arena_resolver = arena_resolver
        self._wal: WriteAheadLog | None = None
        self._lock_fd: int | None = None
        self._closed = False
        self._stopping = False
        self._tail = Tail()
        self._schema = Schema()
        self._buckets = Buckets(name, self.path, config, backend if remote is None else remote.backend(backend))
        self._log = ConsumptionLog(self.path / "consumption.log")
        flush_lock = asyncio.Lock()
        self._index = SampleIndex(self._buckets, self._tail, flush_lock, lambda: self._clears.by_partition)
        self._clears = Clears(config, self._log, self._index, self._tail, self._buckets, flush_lock)
        self._reader = Reader(name, self._tail, self._buckets, self._index, self._clears, self._schema, self.metrics)
        self._describer = Describer(self._reader, self._index, self._clears, self._schema)
        self._takes = Takes(self._log, self._index, self._tail, self._clears, self._reader, self._check_open)
        parts = (self._tail, self._buckets, self._index, self._schema, self.metrics, flush_lock)
        self._flusher = Flusher(
            name, self.path, config, *parts, housekeeping=self._clears, on_flushed=on_flushed, remote=remote
        )
        put_parts = (self._tail, self._schema, self._index, self._clears, self._flusher, self.metrics)
        self._appender = Appender(name, config, *put_parts, self._accepting)
        # Which sample each (partition, key) names (engine/keys.py): the KV calls' index, derived from the rows.
        self.keys = KeyIndex(self._buckets, self._tail, self._clears, flush_lock, self.append, self.clear)

    # -- the marks and the schema -------------------------------------------------------------------

    @property
    def kinds(self) -> dict[str, str]:
        """Field -> kind (see wire/codec.py); read only."""
        return self._schema.kinds

    @property
    def next_index(self) -> int:
        return self._tail.next_index

    @property
    def visible_upto(self) -> int:
        """Every index below is acknowledged and readable."""
        return self._tail.visible_upto

    @property
    def flushed_upto(self) -> int:
        """Every index below is in the backends."""
        return self._tail.flushed_upto

    # -- opening ------------------------------------------------------------------------------------

    async def open(self) -> None:
        files = await asyncio.to_thread(
            opening.open_files,
            self.path,
            self.name,
            self.config,
            self.backend_name,
            self._schema,
            self._log,
            self._buckets,
            self._remote,
        )
        self._lock_fd, self._wal = files.lock_fd, files.wal
        self._clears.load()
        self._takes.load(files.taken)
        # A backend that forgets its rows (in memory) starts empty: the log replays everything.
        flushed = files.flushed_upto if self._buckets.durable else 0
        await self._buckets.load_indexes()
        next_index = opening.replay(
            self.name,
            files.wal,
            flushed,
            self._buckets.top(),
            self._tail,
            self._schema,
            self._appender.remember,
            self._arena_resolver,
        )
        self._tail.start(flushed, next_index)
        files.wal.rotate(next_index)
        self._flusher.start(files.wal)
        self._appender.start(files.wal)
        if self._tail.chunks:
            await self._flusher.flush_once()  # completes whatever flush a crash interrupted
        await self._clears.load_payloads(self._schema.kinds)  # the payload rows nothing references: cleared
        await self._clears.purge_unread()  # nothing reads yet, so no position can move under a reader
        self._flusher.run()

    # -- writing ------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosedError(f"topic {self.name!r} is closed")

    def _accepting(self) -> None:
        if self._stopping:
            raise QueueClosedError(f"topic {self.name!r} is closing")

    async def append(
        self,
        batch: EncodedBatch,
        partition: str,
        rows_blob: bytes,
        key: str | None = None,
        arena: ArenaPayload | None = None,
        of: list[int] | None = None,
        durable: bool = True,
    ) -> tuple[int, int]:
        """Store encoded rows durably; returns (first global index, count) once acknowledged. See
        ``puts.Appender.append`` (``key``: a retried put is stored once; ``of``: a patch of existing samples)."""
        self._check_open()
        return await self._appender.append(batch, partition, rows_blob, key, arena, of, durable)

    async def recall(self, key: str) -> tuple[int, int] | None:
        """The result of the put_batch stored under ``key`` (once acknowledged), or None if there was none."""
        return await self._appender.recall(key)

    # -- flushing -----------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Return once every record acknowledged before this call is stored in the backends."""
        self._check_open()
        await self._flusher.flush()

    def flush_soon(self) -> None:
        """Start a background flush now, without the usual spacing (the arena needs the space)."""
        self._flusher.flush_soon()

    async def maintain(self) -> None:
        """The backends' housekeeping (compaction, version cleanup) now; the flush loop runs it after flushes."""
        await self._buckets.maintain()

    # -- reading ------------------------------------------------------------------------------------

    def count(self) -> int:
        return self._tail.visible_upto

    async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Rows with global index in [offset, offset+limit), in index order, and the kinds to decode them."""
        self._check_open()
        return await self._reader.read(offset, limit)

    async def read_window(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """``read``, and where the window ended: the next read starts there (see ``reader.Reader.read_window``)."""
        self._check_open()
        return await self._reader.read_window(offset, limit)

    async def wait_beyond(self, index: int, timeout: float | None) -> bool:
        """Wait until a record with global index >= ``index`` is visible; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._tail.visible_upto <= index:
            self._check_open()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            await self._tail.changed(left)
        return True

    # -- samples ------------------------------------------------------------------------------------

    async def field_index(self) -> FieldIndex:
        """Own fields and patches of every sample (built with the partition index on first use)."""
        return await self._index.field_index()

    async def take(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None = 0.0,
        sampler: Sampler | None = None,
        lease: tuple[float, Peer | None] | None = None,
        fields: list[str] | None = None,
        request_key: str | None = None,
        **kw: Any,
    ) -> list[int]:
        """The next samples of ``partition`` for ``task``: see ``takes.Takes.take``."""
        self._check_open()
        return await self._takes.take(partition, task, batch_size, timeout, sampler, lease, fields, request_key, **kw)

    async def mark_consumed(self, partition: str, task: str, indexes: list[int]) -> None:
        """Acknowledge samples for ``task``: they are never handed to it again (logged like a take)."""
        self._check_open()
        await self._takes.mark_consumed(partition, task, indexes)

    def reset_consumption(self, partition: str, task: str) -> None:
        """Every sample of ``partition`` becomes available to ``task`` again (logged: it survives a restart)."""
        self._check_open()
        self._takes.reset_consumption(partition, task)

    def give_back(self, partition: str, task: str, indexes: list[int]) -> None:
        """The task's leases on these samples end unconsumed (a nack): see ``takes.Takes.give_back``."""
        self._check_open()
        self._takes.give_back(partition, task, indexes)

    def not_cleared(self, indexes: list[int]) -> list[int]:
        """``indexes`` without the cleared samples (a take's answer: one cleared since it was taken is gone)."""
        return self._clears.not_cleared(indexes)

    async def clear(self, partition: str, indexes: list[int] | None) -> int:
        """Delete samples of ``partition`` (None: every sample it has); returns how many were newly cleared."""
        self._check_open()
        targets = await self._clears.clear(partition, indexes)
        if targets:
            self._takes.release(partition, targets)
            self._flusher.want()  # the flush loop schedules the purge
        if indexes is None:  # the whole partition: gone from kv_list too (TransferQueue's clear_partition)
            self.keys.partition_cleared(partition)
        return len(targets)

    async def set_tags(self, partition: str, items: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Merge tags into samples of ``partition`` (see partitions.Clears.set_tags)."""
        self._check_open()
        await self._clears.set_tags(partition, items)

    async def partitions(self) -> dict[str, dict[str, Any]]:
        """Per partition: samples (not cleared), cleared, and per task how many it has taken (and holds leased)."""
        self._check_open()
        return self._takes.listing(await self._index.partitions())

    async def describe(self, indexes: list[int], lenient: bool = False) -> list[list[Any]]:
        """Field descriptions and tags of samples, run-length encoded: see ``describing.Describer.describe``."""
        return await self._describer.describe(indexes, lenient)

    async def sample_rows(self, indexes: list[int], fields: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The stored values of ``fields`` of samples, each from the latest row that wrote it, in the order given."""
        return await self._reader.sample_rows(indexes, fields)

    async def sample_columns(self, indexes: list[int], fields: list[str]) -> tuple[dict[str, Any], list[Any], Any]:
        return await self._reader.sample_columns(indexes, fields)  # the dense fields as columns: see ``Reader``

    async def plain_values(self, indexes: list[int], names: list[str]) -> list[dict[str, Any]]:
        """Stored values of non-tensor fields of samples, read beside the arena views (see ``Reader``)."""
        return await self._reader.plain_values(indexes, names)

    def arena_runs(self, indexes: list[int], fields: list[str]) -> list[tuple[int, list[list[Any]]]] | None:
        """Where the tensor fields of ``indexes`` lie in the arena, if all of them do (else None); see ``Reader``."""
        return self._reader.arena_runs(indexes, fields)

    def spool_runs(self, indexes: list[int], fields: list[str]) -> list[tuple[str, list[list[Any]]]] | None:
        """Where the dense fields of ``indexes`` lie in spool files, if all of them do (else None); see ``Reader``."""
        return self._reader.spool_runs(indexes, fields)

    def forget_arena(self, extent_id: int) -> None:
        """The arena reuses this extent: its (flushed) samples are read from the backends from now on."""
        self._tail.forget_arena(extent_id)

    async def stats(self) -> dict[str, Any]:
        wal = self._wal
        tail = self._tail
        out: dict[str, Any] = {
            "name": self.name,
            "path": str(self.path),
            "total_count": tail.visible_upto,
            "next_index": tail.next_index,
            "flushed": tail.flushed_upto,
            "buffered": tail.visible_upto - tail.flushed_upto,
            "num_buckets": self.config.num_buckets,
            "bucket_column": self.config.bucket_column,
            "durability": self.config.durability,
            "backend": self.backend_name,
            "fields": dict(self._schema.kinds),
            "wal_bytes": await asyncio.to_thread(wal.size_bytes) if wal is not None else 0,
            "buckets": await self._buckets.stats(),
        }
        if self._flusher.error is not None:
            out["last_flush_error"] = repr(self._flusher.error)
        return out

    # -- closing ------------------------------------------------------------------------------------

    async def close_quietly(self) -> None:
        """Release files after a failed open, without flushing."""
        self._closed = self._stopping = True
        if self._wal is not None:
            with contextlib.suppress(Exception):
                await self._wal.close()
            self._wal = None
        with contextlib.suppress(Exception):
            self._log.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._remote is not None:
            await asyncio.to_thread(self._remote.detach)

    async def _acknowledge_logged(self) -> None:
        """At close: rows already in the log count as acknowledged (a reopen would replay them anyway), so the
        last flush takes them too. A put still waiting for its sync when close began would otherwise stay in the
        log alone, and a broker removes its arena after a clean stop: the replay would find its tensors gone."""
        tail = self._tail
        if self._wal is not None and tail.visible_upto < tail.next_index:
            await self._wal.commit()
            tail.acknowledge(tail.next_index)
            self._index.acknowledged()

    async def close(self) -> None:
        if self._closed:
            return
        self._stopping = True
        try:
            await self._flusher.stop()
            await self._acknowledge_logged()
            await self._flusher.flush_once()
            await self._clears.purge_now()  # every row is flushed now: the cleared ones leave Lance before close
            if self._buckets.durable:  # a reopen then skips the log's flushed frames without decoding them
                await asyncio.to_thread(
                    write_json_atomic, self.path / "state.json", {"flushed_upto": self._tail.flushed_upto}
                )
        finally:
            self._closed = True
            self._tail.wake()
            await self._buckets.close()
            if self._wal is not None:
                await self._wal.close()
                self._wal = None
            self._log.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None
            if self._remote is not None:  # after the last write: another node may take the topic now
                await asyncio.to_thread(self._remote.detach)
