"""Opening a topic: its lock, its stored settings, and recovery from whatever the last process left.

A mixin of ``engine.Topic`` (like flushing.py), on the engine's loop. ``open()``:

1. takes the topic's flock (one process per topic; another gets ``TopicLockedError`` naming the holder's pid),
   checks ``topic.json`` against the asked settings (a mismatch is a ``ConfigError``), reads ``schema.json``
   and ``state.json``, replays the consumption log (takes, clears, tags, rank answers, take keys) and opens
   one backend per bucket (a bucket folder whose first commit never landed is started afresh there);
2. reads every bucket's index column (strictly increasing, or ``CorruptionError``);
3. replays the write-ahead log above ``flushed_upto`` into the tail: the rows of an arena batch are re-adopted
   from the arena a killed broker left behind (``_readopt``), retry keys are remembered again;
4. completes the flush a crash interrupted, then purges the rows of cleared samples before anything reads,
   and starts the background flush loop.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, CorruptionError, StorageError, TopicLockedError
from ..queue.backend import StorageBackend
from ..tensors.column import Column, storage_dtype
from ..wire.codec import INDEX_KEY
from .config import TopicConfig
from .consumption import ConsumptionLog
from .layout import IndexColumn, read_json, write_json_atomic
from .location import ObjectStoreTopic
from .samples import Consumption
from .tail import ArenaPayload, Chunk, materialize
from .wal import WriteAheadLog

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# (arena generation, offset, nbytes) -> a view of those bytes in that arena, or None when that arena is gone.
ArenaResolver = Callable[[bytes, int, int], np.ndarray | None]


class Opening:
    name: str
    path: Path
    config: TopicConfig
    backend_name: str
    kinds: dict[str, str]
    next_index: int
    visible_upto: int
    flushed_upto: int
    _factory: Callable[..., StorageBackend]
    _arena_resolver: ArenaResolver | None
    _lock_fd: int | None
    _backends: list[StorageBackend]
    _columns: list[IndexColumn]
    _tail: list[Chunk]
    _wal: WriteAheadLog | None
    _kinds_written: dict[str, str]
    _durable_backend: bool
    _consumption_log: ConsumptionLog | None
    _consumption: dict[tuple[str, str], Consumption]
    _cleared: set[int]
    _cleared_in: dict[str, set[int]]
    _tags: dict[int, dict[str, Any]]
    _rank_cache: OrderedDict[tuple[Any, ...], list[int]]
    _take_keys: OrderedDict[str, list[int]]
    _flusher: asyncio.Task[None] | None
    _remote: ObjectStoreTopic | None

    if TYPE_CHECKING:  # provided by engine.Topic and its other mixins

        def _remember(self, key: str, first: int, n: int) -> None: ...

        def _add_chunk(
            self,
            first: int,
            partition: str,
            rows: list[dict[str, Any]],
            arena: ArenaPayload | None = None,
            whole: bool = False,
            patch: tuple[list[int], list[str]] | None = None,
        ) -> None: ...

        async def _flush_once(self, step_bytes: int | None = None) -> None: ...

        async def _flush_loop(self) -> None: ...

        async def _purge_cleared(self) -> None: ...

    async def open(self) -> None:
        await asyncio.to_thread(self._open_files)
        durable = all(getattr(b, "durable", True) for b in self._backends)
        self._durable_backend = durable
        if not durable:
            self.flushed_upto = 0
        for b, backend in enumerate(self._backends):
            indexes = await self._read_indexes(backend)
            if None in indexes or not bool(np.all(np.diff(np.asarray(indexes, dtype=np.int64)) > 0)):
                raise CorruptionError(
                    f"bucket {b} of topic {self.name!r} holds rows without increasing "
                    f"{INDEX_KEY!r} values; it was not written by this engine"
                )
            self._columns.append(IndexColumn(indexes))
        wal = self._wal
        if wal is None:
            raise StorageError("write-ahead log not opened")
        top = max([self.flushed_upto - 1, *(c.last() for c in self._columns)])
        for frame in wal.replay():
            partition, new_kinds, key, ref, patch = (*frame.header, None, None, None)[:5]
            self.kinds.update(new_kinds)
            if key is not None:
                self._remember(key, frame.first_index, frame.count)
            end = frame.first_index + frame.count
            top = max(top, end - 1)
            if end <= self.flushed_upto:
                continue
            rows = frame.rows()
            if ref is not None:
                rows = self._readopt(ref, rows, frame.first_index)
            if patch is not None:
                patch = ([int(i) for i in patch[0]], [str(f) for f in patch[1]])
            self._add_chunk(frame.first_index, partition, rows, whole=ref is not None, patch=patch)
        self.next_index = top + 1
        self.visible_upto = self.next_index
        wal.rotate(self.next_index)
        if self._tail:
            await self._flush_once()  # completes whatever flush a crash interrupted
        await self._purge_cleared()  # nothing reads yet, so no position can move under a reader
        self._flusher = asyncio.ensure_future(self._flush_loop())

    def _open_files(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"cannot create topic folder {self.path}: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock_fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._lock_fd)
            self._lock_fd = None
            raise TopicLockedError(
                f"topic {self.name!r} at {self.path} is open in another process (pid {holder}); "
                "embedded mode serves one process: run persisting-broker to share a topic"
            ) from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, str(os.getpid()).encode(), 0)
        meta = {
            "format": FORMAT_VERSION,
            "name": self.name,
            "num_buckets": self.config.num_buckets,
            "bucket_column": self.config.bucket_column,
            "backend": self.backend_name,
        }
        if self._remote is not None:  # the object store's lease, and its settings and schema on a fresh node
            self._remote.attach(self.path, meta)
        stored = read_json(self.path / "topic.json")
        if stored is None:
            write_json_atomic(self.path / "topic.json", meta)
        else:
            for key in ("num_buckets", "bucket_column", "backend"):
                if stored.get(key) != meta[key]:
                    raise ConfigError(
                        f"topic {self.name!r} was created with {key}={stored.get(key)!r}, "
                        f"this Queue asks for {key}={meta[key]!r}; pass the stored value "
                        "(or use a new topic name)"
                    )
        self.kinds = dict(read_json(self.path / "schema.json") or {})
        self._kinds_written = dict(self.kinds)
        state = read_json(self.path / "state.json") or {}
        self.flushed_upto = int(state.get("flushed_upto", 0))
        self._wal = WriteAheadLog(self.path / "wal", sync=self.config.durability == "sync")
        self._consumption_log = ConsumptionLog(self.path / "consumption.log")
        self._consumption = {key: Consumption(done) for key, done in self._consumption_log.open().items()}
        self._cleared_in = {p: set(indexes) for p, indexes in self._consumption_log.cleared.items()}
        self._cleared = set().union(*self._cleared_in.values())
        self._tags = {i: tags for tagged in self._consumption_log.tags.values() for i, tags in tagged.items()}
        self._rank_cache = OrderedDict(self._consumption_log.answers)
        self._take_keys = OrderedDict(self._consumption_log.keys)
        kwargs = dict(self.config.backend_kwargs)
        self._backends = [
            self._factory(b, str(self.path), batch_size=self.config.batch_size, **kwargs)
            for b in range(self.config.num_buckets)
        ]

    async def _read_indexes(self, backend: StorageBackend) -> list[Any]:
        return await self._read_column(backend, INDEX_KEY)

    @staticmethod
    async def _read_column(backend: StorageBackend, key: str) -> list[Any]:
        reader = getattr(backend, "read_column", None)
        if reader is not None:
            return list(await reader(key))
        values: list[Any] = []
        async for rows in backend.get_stream(backend.total_count(), 0):
            values.extend(r.get(key) for r in rows)
        return values

    def _readopt(self, ref: Any, rows: list[dict[str, Any]], first: int) -> list[dict[str, Any]]:
        """Rows of a logged arena batch, with its payload copied from the arena a killed broker left behind."""
        try:
            generation, base, fields = bytes(ref["gen"]), int(ref["offset"]), ref["fields"]
            n = len(rows)
            columns: dict[str, Column] = {}
            for name, kind, dtype_name, shape, offset, nbytes in fields:
                view = None if self._arena_resolver is None else self._arena_resolver(generation, base + offset, nbytes)
                if view is None:
                    log.error(
                        "topic %r: the tensor payload of rows %d..%d (field %r) was in a shared-memory arena that "
                        "is gone (the machine restarted before it was flushed); those fields read back as None",
                        self.name,
                        first,
                        first + n - 1,
                        name,
                    )
                    continue
                arr = view.view(storage_dtype(kind, dtype_name)).reshape((n, *shape))
                columns[name] = Column(kind, dtype_name, arr)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptionError(f"topic {self.name!r}: a log frame's arena reference is malformed: {exc}") from exc
        return materialize(rows, ArenaPayload(0, ref, columns))
