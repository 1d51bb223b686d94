"""A topic's buckets: one storage backend per bucket, and each bucket's index column.

The rows of a topic are spread over ``num_buckets`` backends (``bucket-<i>`` under the topic's folder; which
bucket a row goes to is decided by the flush, see layout.bucket_of). Each bucket's rows are stored in increasing
global index, and ``IndexColumn`` keeps that column in memory: the position of a row in its backend is the
position of its index in the column, so a read of a global index range is a ``searchsorted`` per bucket and one
positional read per bucket, merged by index.

Writes: ``write`` stores one flush's rows of a bucket (tensor fields as typed columns where the backend has
``put_columns``); a failed write reopens the bucket from what is on disk (a Lance commit can land and still
raise), and rows at or below ``last(b)`` are skipped by the caller, so the retry stores exactly what is missing.
Deletes (``purge``) move positions: the caller holds reads off meanwhile (gate.ReadGate).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptionError
from ..storage.backend import StorageBackend
from ..wire.codec import INDEX_KEY, OF_KEY
from .config import TopicConfig
from .layout import IndexColumn
from .tail import Chunk, tensor_parts

log = logging.getLogger(__name__)


class Buckets:
    """The backends of one topic and their index columns; their one owner."""

    def __init__(self, name: str, path: Path, config: TopicConfig, factory: Callable[..., StorageBackend]) -> None:
        self._name = name
        self._path = path
        self._config = config
        self._factory = factory
        self._backends: list[StorageBackend] = []
        self._columns: list[IndexColumn] = []
        # Buckets whose write failed and whose reopen failed too: their backend object may still hold the rows it
        # could not write (a retry through it would store them twice), so they are reopened before any use.
        self._stale: set[int] = set()
        self._refreshing = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._backends)

    @property
    def durable(self) -> bool:
        """Whether every backend keeps its rows across a new backend object (else the log keeps everything)."""
        return all(getattr(b, "durable", True) for b in self._backends)

    @property
    def columnar(self) -> bool:
        """Whether every backend takes tensor fields as typed columns (``put_columns``)."""
        return all(hasattr(b, "put_columns") for b in self._backends)

    def _make(self, b: int) -> StorageBackend:
        return self._factory(b, str(self._path), batch_size=self._config.batch_size, **self._config.backend_kwargs)

    def create(self) -> None:
        """Open one backend per bucket (blocking: on a worker thread)."""
        self._backends = [self._make(b) for b in range(self._config.num_buckets)]

    async def load_indexes(self) -> None:
        """Read every bucket's index column. One that is not strictly increasing is put back in order by its
        backend (``repair_order``: a bucket that an older version's compaction reordered), with one log line;
        where it cannot be, ``CorruptionError`` names the bucket and the command that inspects it."""
        for b, backend in enumerate(self._backends):
            indexes = await read_column(backend, INDEX_KEY)
            if not _increasing(indexes):
                await self._repair(b, backend)
                indexes = await read_column(backend, INDEX_KEY)
                if not _increasing(indexes):
                    raise self._corrupt(b, backend, "is still out of order after its repair")
            self._columns.append(IndexColumn(indexes))

    async def _repair(self, b: int, backend: StorageBackend) -> None:
        repair = getattr(backend, "repair_order", None)
        if repair is None:
            raise self._corrupt(b, backend, f"holds rows without increasing {INDEX_KEY!r} values")
        try:
            what = await repair()
        except CorruptionError as exc:
            raise self._corrupt(b, backend, str(exc)) from exc
        log.warning(
            "topic %r bucket %d: its rows were out of index order (left by an older version's compaction); %s",
            self._name,
            b,
            what,
        )

    def _corrupt(self, b: int, backend: StorageBackend, problem: str) -> CorruptionError:
        where = getattr(backend, "uri", None) or str(self._path / f"bucket-{b}")
        return CorruptionError(
            f"bucket {b} of topic {self._name!r} ({where}) {problem}; inspect it with "
            f"`persisting-broker check --storage-path {self._path.parent} --topic {self._name}`"
        )

    def last(self, b: int) -> int:
        """The largest global index bucket ``b`` holds (-1: none)."""
        return self._columns[b].last()

    def top(self) -> int:
        """The largest global index any bucket holds (-1: none)."""
        return max([-1, *(c.last() for c in self._columns)])

    async def _refresh(self) -> None:
        if not self._stale:
            return
        # One refresh at a time: the writes of one flush run concurrently, and a second reopen of the same bucket
        # finishing last would put back a backend and an index column from before the first one's write.
        async with self._refreshing:
            for b in sorted(self._stale):
                await self._reopen(b)
                self._stale.discard(b)

    async def columns(self, *keys: str) -> list[list[list[Any]]]:
        """Per bucket, the values of each of ``keys`` in position order."""
        await self._refresh()
        return [[await read_column(backend, key) for key in keys] for backend in self._backends]

    async def read(self, lo: int, hi: int, described: bool = False) -> list[dict[str, Any]]:
        """The stored rows with global index in ``[lo, hi)``, in index order (``hi`` at most what is flushed).
        ``described``: dense tensor values as descriptions, not read, where the backend can (``get_described``)."""
        await self._refresh()
        plans = []
        for b, col in enumerate(self._columns):
            view = col.view()
            p0 = int(np.searchsorted(view, lo, "left"))
            p1 = int(np.searchsorted(view, hi, "left"))
            if p1 > p0:
                plans.append((b, p0, p1))
        gets = [getattr(self._backends[b], "get_described", None) if described else None for b, _, _ in plans]
        parts = await asyncio.gather(
            *((get or self._backends[b].get)(p1 - p0, p0) for get, (b, p0, p1) in zip(gets, plans, strict=True))
        )
        merged: list[tuple[int, dict[str, Any]]] = []
        for part in parts:
            merged.extend((row[INDEX_KEY], row) for row in part)
        merged.sort(key=lambda pair: pair[0])
        return [row for _, row in merged]

    async def take_dense(
        self, indexes: np.ndarray, names: list[str]
    ) -> list[tuple[np.ndarray, dict[str, tuple[str, list[np.ndarray]] | None]]] | None:
        """Dense tensor fields of stored rows as arrays (``indexes``: sorted, unique, all below what is flushed):
        per bucket holding some, (its indexes among them, in order; per field the dtype name and arrays of their
        samples in that order, or None where that bucket's column is not dense: storage/lance_dense.py). None if a
        backend cannot (no ``take_dense``) or a row is not stored (the caller reads rows instead)."""
        await self._refresh()
        plans: list[tuple[int, np.ndarray, np.ndarray]] = []
        for b, col in enumerate(self._columns):
            view = np.asarray(col.view(), dtype=np.int64)
            if not len(view):
                continue
            pos = np.searchsorted(view, indexes)
            mine = (pos < len(view)) & (view[np.minimum(pos, len(view) - 1)] == indexes)
            if mine.any():
                plans.append((b, indexes[mine], pos[mine].astype(np.int64)))
        if sum(len(idx) for _, idx, _ in plans) != len(indexes):
            return None
        if not all(hasattr(self._backends[b], "take_dense") for b, _, _ in plans):
            return None
        takes = [self._backends[b].take_dense(pos, names) for b, _, pos in plans]  # type: ignore[attr-defined]
        parts = await asyncio.gather(*takes)
        return [(idx, part) for (_, idx, _), part in zip(plans, parts, strict=True)]

    async def write(
        self,
        b: int,
        rows: list[dict[str, Any]],
        indexes: list[int],
        arena: list[tuple[int, Chunk, int]],
        kinds: dict[str, str],
    ) -> None:
        """Store one flush's ``rows`` of bucket ``b`` (``arena``: the arena batches among them, see tail.py)."""
        await self._refresh()
        try:
            backend = self._backends[b]
            tensors = tensor_parts(rows, arena, kinds) if hasattr(backend, "put_columns") else {}
            if tensors:
                # Tensor fields as typed columns (over the arena's memory for arena batches): see tensor_columns.
                await backend.put_columns(rows, tensors)  # type: ignore[attr-defined]
            else:
                await backend.put_batch(rows)
                await backend.flush()
        except Exception:
            # The rows may or may not have landed (a Lance commit can land and still raise). Start the bucket
            # afresh from what is on disk, so the retry stores exactly what is missing.
            if self.durable:
                self._stale.add(b)
                with contextlib.suppress(Exception):  # the write's own error is the one to report
                    await self._reopen(b)
                    self._stale.discard(b)
            raise
        # Reads never look at indexes at or above flushed_upto, so growing the column early is safe; it makes a
        # retry after another bucket's failure skip the rows this bucket already holds.
        self._columns[b].extend(indexes)

    async def _reopen(self, b: int) -> None:
        backend = await asyncio.to_thread(self._make, b)
        self._backends[b] = backend
        self._columns[b] = IndexColumn(await read_column(backend, INDEX_KEY))

    async def maintain(self) -> None:
        """Each backend's housekeeping (compaction, version cleanup), where it has some."""
        await self._refresh()
        for backend in self._backends:
            maintain = getattr(backend, "maintain", None)
            if maintain is not None:
                await maintain()

    async def purge(self, cleared: set[int]) -> None:
        """Delete the rows of ``cleared`` samples and the patch rows that wrote their fields, from the backends
        that can (``delete_rows``); then reload each changed bucket's index column. Positions move: no read may
        be in flight."""
        await self._refresh()
        doomed_ids = np.fromiter(cleared, dtype=np.int64, count=len(cleared))
        for b, backend in enumerate(self._backends):
            delete = getattr(backend, "delete_rows", None)
            if delete is None:
                continue
            view = self._columns[b].view()
            doomed = [int(i) for i in view[np.isin(view, doomed_ids)]]
            targets = await read_column(backend, OF_KEY)
            doomed += [int(i) for i, of in zip(view.tolist(), targets, strict=True) if of is not None and of in cleared]
            if not doomed:
                continue
            await delete(sorted(set(doomed)))
            self._columns[b] = IndexColumn(await read_column(backend, INDEX_KEY))
            log.info("topic %r bucket %d: deleted %d rows of cleared samples", self._name, b, len(doomed))

    async def stats(self) -> list[dict[str, Any]]:
        return [await backend.stats() for backend in self._backends]

    async def close(self) -> None:
        for backend in self._backends:
            aclose = getattr(backend, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # the log still holds every row; the files must be released regardless
                    log.exception("closing a backend of topic %r failed", self._name)


def _increasing(indexes: list[Any]) -> bool:
    return None not in indexes and bool(np.all(np.diff(np.asarray(indexes, dtype=np.int64)) > 0))


async def read_column(backend: StorageBackend, key: str) -> list[Any]:
    """One column of a backend in position order (``read_column`` where it has one, else a full scan)."""
    reader = getattr(backend, "read_column", None)
    if reader is not None:
        return list(await reader(key))
    values: list[Any] = []
    async for rows in backend.get_stream(backend.total_count(), 0):
        values.extend(r.get(key) for r in rows)
    return values
