"""LanceBackend: one bucket as one Lance dataset, appended to in large batches.

Layout: ``<storage_path>/bucket-<bucket_id>.lance``. Each row key is a column (typed by its first non-null value:
bool, int64, float64, large_string, large_binary; key characters Lance refuses are percent-escaped); an explicit
``None`` is listed in ``_persisting_nulls``, so it reads back as ``None`` while an absent key stays absent.

Policy (measured on a 2-core machine; see DESIGN.md):
- A flush is one append (4-6 ms per Lance commit whatever its size), never a rewrite; a large one goes through
  ``encoders`` threads, a fragment each, in one commit (lance_parallel). Every new file and folder is then
  fsync'ed: Lance never syncs, and the engine trims its write-ahead log on the strength of this flush.
- Compaction: once ``compact_min_fragments`` fragments are smaller than ``target_rows_per_fragment``, they are
  merged beside the appends, committed in one Rewrite that keeps the row order (lance_compaction, lance_order).
  Old versions go ``retain_seconds`` after they were superseded, at most once per ``cleanup_interval_seconds``.
- At open: a zero-byte newest manifest (a power loss) is removed; a folder without a committed manifest (a kill
  during the first write) is removed; rows out of index order are put back in order by the engine's call of
  ``repair_order`` (lance_order).

Tensor fields (``put_columns``) are typed Arrow columns (``tensor_columns``), built over the memory the samples lie
in. When a field's layout has to move on (a sample of another shape or dtype), its column is rewritten once: added
under a temporary name, the old one dropped, the new one renamed (three commits; an open completes or undoes a
rewrite a kill interrupted). Reads give the codec's row values back; ``take_dense`` gives dense ones as arrays
(lance_dense), ``get_described`` describes them without reading them (lance_described).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from ..errors import PersistingError, SchemaConflictError, StorageError
from ..wire.codec import INDEX_KEY
from . import lance_compaction, lance_dense, lance_described, lance_order, lance_parallel, tensor_columns
from ._stream import RowStream
from .lance_columns import (
    ARROW_TYPES,
    NULLS_COLUMN,
    column_name,
    finish_rewrite,
    interrupted_rewrites,
    key_name,
    payload_field,
    rewrite_column,
    rows_to_table,
    table_to_rows,
)
from .lance_files import FileSync, recover_folder, shared_session
from .tensor_columns import Layout, Part

log = logging.getLogger(__name__)

DELETE_CHUNK_ROWS = 1000  # global indexes per delete predicate


class LanceBackend:
    durable = True

    def __init__(
        self,
        bucket_id: int,
        storage_path: str,
        batch_size: int = 100,
        *,
        target_rows_per_fragment: int = 131_072,
        compact_min_fragments: int = 16,
        retain_seconds: float = 10.0,
        cleanup_interval_seconds: float = 10.0,
        storage_options: Mapping[str, str] | None = None,
        guard: Callable[[], None] | None = None,
        encoders: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.bucket_id = bucket_id
        self.batch_size = max(1, int(batch_size))
        self._stream = RowStream(self.get, self.total_count)
        # An object-store URI (object_store.py) or a local folder. On an object store a commit is durable once the
        # store acknowledged it, so there is nothing to fsync and no zero-byte manifest to repair.
        remote = "://" in str(storage_path)
        self.uri = f"{str(storage_path).rstrip('/')}/bucket-{bucket_id}.lance"
        self._local: Path | None = None if remote else Path(self.uri)
        self._options = dict(storage_options or {})
        self._guard = guard or (lambda: None)  # raises unless this engine may write (the object store's lease)
        self.target_rows_per_fragment = target_rows_per_fragment
        self.compact_min_fragments = compact_min_fragments
        self.retain_seconds = retain_seconds
        self.cleanup_interval_seconds = cleanup_interval_seconds
        self.encoders = (  # threads per append (lance_parallel): the cores, at most 8, or PERSISTING_LANCE_ENCODERS
            lance_parallel.default_encoders() if encoders is None else lance_parallel.check_encoders(encoders)
        )
        self._buffer: list[dict[str, Any]] = []
        self._types: dict[str, pa.DataType] = {}
        self._tensors: dict[str, Layout] = {}  # tensor fields' layouts (keys put through put_columns)
        self._ds: lance.LanceDataset | None = None
        self._stored = 0
        self._files = FileSync(self._local)  # fsync of what Lance wrote (nothing to do on an object store)
        self._lock = asyncio.Lock()
        # Schema changes and compaction, on worker threads: never two at once (Lance would refuse the second commit).
        self._exclusive = threading.Lock()
        self._last_cleanup = time.monotonic()
        self._deferred = 0  # compactions refused in a row because appends landed meanwhile (lance_compaction)
        self.commits = 0
        local = self._local
        if local is not None:
            recover_folder(local)
        if local is None or local.exists():
            try:
                self._ds = self._dataset()
            except (ValueError, OSError) as exc:
                # On an object store a bucket without a committed version is simply not there yet.
                if local is not None or "was not found" not in str(exc):
                    raise StorageError(f"cannot open Lance dataset {self.uri}: {exc}") from exc
        if self._ds is not None:
            self._finish_rewrites()
            # Fragments of an append whose commit never came (a kill between them), while nothing else writes.
            lance_parallel.remove_orphans(self._dataset(), self.retain_seconds, self._guard)
            self._stored = self._ds.count_rows()
            for field in self._ds.schema:
                if field.name != NULLS_COLUMN:
                    self._types[key_name(field.name)] = field.type
                    if (field.metadata or {}).get(tensor_columns.LAYOUT_KEY):
                        self._tensors[key_name(field.name)] = Layout.of_field(field)

    # -- protocol -----------------------------------------------------------------------------------

    def total_count(self) -> int:
        return self._stored + len(self._buffer)

    async def put(self, record: dict[str, Any]) -> None:
        await self.put_batch([record])

    async def put_batch(self, records: list[dict[str, Any]]) -> None:
        self._register(records)
        self._buffer.extend(dict(r) for r in records)
        self._stream.notify()
        if len(self._buffer) >= self.batch_size:
            await self.flush()

    def _register(self, records: list[dict[str, Any]], skip: frozenset[str] = frozenset()) -> None:
        """Check the values' types against the columns (new keys become columns); ``skip``: tensor fields, whose
        columns ``put_columns`` types itself."""
        pending: dict[str, pa.DataType] = {}
        # Check each distinct (key, Python type) once, not each value: a batch has few of them.
        pairs = {
            (key, type(value))
            for record in records
            for key, value in record.items()
            if value is not None and key not in skip
        }
        for key, kind in sorted(pairs, key=lambda p: (p[0], p[1].__qualname__)):
            t = ARROW_TYPES.get(kind)
            if t is None:
                raise SchemaConflictError(key, "a plain column", kind.__qualname__)
            known = self._types.get(key) or pending.get(key)
            if known is None:
                column_name(key)
                pending[key] = t
            elif known != t:
                raise SchemaConflictError(key, str(known), str(t))
        self._types.update(pending)

    async def put_columns(self, records: list[dict[str, Any]], tensors: dict[str, tuple[str, list[Part]]]) -> None:
        """Engine extension: rows plus their tensor fields as typed columns, written now as one append.

        ``tensors[key] = (kind, parts)``: the field's kind ("ndarray" or "tensor") and its values for every row in
        order, as ``Column`` slices (a batch's samples, e.g. views on shared memory: the Arrow column is built
        over that memory, no copy) and lists of row values (the codec's bytes or None); a row's own value for such
        a key is ignored, except that an explicit None is kept as one. See tensor_columns for the layouts.
        """
        await self.flush()
        self._register(records, frozenset(tensors))
        async with self._lock:
            built: dict[str, tuple[pa.Field, pa.ChunkedArray]] = {}
            for key, (kind, parts) in tensors.items():
                runs = tensor_columns.to_runs(kind, parts)
                stored = self._tensors.get(key)
                if stored is None and key in self._types:  # a 0.1 topic's bytes column, or a plain one
                    stored = Layout.of_field(pa.field(key, self._types[key]))
                layout = tensor_columns.choose(kind, runs, stored)
                if layout is None:
                    continue
                if stored is not None and tensor_columns.needs_rewrite(stored, layout):
                    await asyncio.to_thread(self._rewrite, key, stored, layout)
                built[key] = (payload_field(layout, column_name(key)), tensor_columns.build(layout, runs))
            types = {k: t for k, t in self._types.items() if k not in built}
            table = rows_to_table(records, types, built)
            ds = await asyncio.to_thread(self._append, table)
            self._ds, self._stored = ds, self._stored + len(records)
            for key, (field, _column) in built.items():
                self._types[key] = field.type
                self._tensors[key] = Layout.of_field(field)
            self.commits += 1
        self._stream.notify()

    def get_stream(
        self, limit: int, offset: int, wait: bool = False, timeout: float | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]:
        return self._stream.rows(limit, offset, wait, timeout)

    async def get(self, limit: int, offset: int) -> list[dict[str, Any]]:
        stop = min(offset + limit, self.total_count())
        if offset >= stop:
            return []
        ds, stored = self._ds, self._stored
        buffered = self._buffer[max(0, offset - stored) : max(0, stop - stored)]
        rows: list[dict[str, Any]] = []
        if offset < stored and ds is not None:
            positions = np.arange(offset, min(stop, stored), dtype=np.int64)
            table = await asyncio.to_thread(lance_dense.take_rows, ds, positions)
            rows = table_to_rows(table, self._tensors)
        return rows + [dict(r) for r in buffered]

    async def flush(self) -> None:
        async with self._lock:
            n = len(self._buffer)
            if n == 0:
                return
            rows, types = self._buffer[:n], dict(self._types)
            ds = await asyncio.to_thread(self._write, rows, types)
            # Both updates in one step of the loop: a concurrent get sees either state, never a gap.
            self._ds, self._stored = ds, self._stored + n
            del self._buffer[:n]
            self.commits += 1

    async def stats(self) -> dict[str, Any]:
        ds = self._ds
        return {
            "bucket_id": self.bucket_id,
            "total_count": self.total_count(),
            "stored": self._stored,
            "buffered": len(self._buffer),
            "version": ds.version if ds is not None else 0,
            "fragments": len(ds.get_fragments()) if ds is not None else 0,
            "commits": self.commits,
            "uri": self.uri,
        }

    # -- engine extensions --------------------------------------------------------------------------

    async def read_column(self, name: str) -> list[Any]:
        await self.flush()
        ds = self._ds
        if ds is None or column_name(name) not in ds.schema.names:
            return [None] * self._stored
        table = await asyncio.to_thread(ds.to_table, columns=[column_name(name)])
        layout = self._tensors.get(name)
        if layout is not None:
            return list(tensor_columns.row_values(layout, table.column(0)))
        values: list[Any] = table.column(0).to_pylist()
        return values

    async def take_dense(self, positions: np.ndarray, names: list[str]) -> dict[str, lance_dense.DenseChunks]:
        """Engine extension: the samples of dense tensor fields at stored positions, as arrays (lance_dense)."""
        ds = self._ds
        if ds is None:
            return dict.fromkeys(names)
        return await asyncio.to_thread(lance_dense.take, ds, positions, names)

    async def get_described(self, limit: int, offset: int) -> list[dict[str, Any]]:
        """Engine extension: ``get`` of stored rows, dense tensor values described, not read (lance_described)."""
        at, ds = np.arange(offset, min(offset + limit, self._stored), dtype=np.int64), self._ds
        return [] if ds is None else await asyncio.to_thread(lance_described.rows, ds, at, dict(self._tensors))

    async def delete_rows(self, indexes: list[int]) -> None:
        """Engine extension: delete the stored rows with these global indexes (the engine calls it at open,
        before any read, because positions after them move down). Compaction later rewrites the fragments."""
        await self.flush()
        async with self._lock:
            if self._ds is None or not indexes:
                return
            self._ds = await asyncio.to_thread(self._delete, indexes)
            self._stored = self._ds.count_rows()

    def _delete(self, indexes: list[int]) -> lance.LanceDataset:
        with self._writing(f"deleting rows from {self.uri}"):
            column = column_name(INDEX_KEY)
            with self._exclusive:
                ds = self._dataset()
                for k in range(0, len(indexes), DELETE_CHUNK_ROWS):
                    part = ", ".join(str(int(i)) for i in indexes[k : k + DELETE_CHUNK_ROWS])
                    ds.delete(f"{column} IN ({part})")
            self._files.sync()
        return ds

    async def repair_order(self) -> str:
        """Engine extension: put the stored rows back in index order (lance_order.repair, one commit); returns
        what was done. ``CorruptionError`` where the order cannot be told."""
        await self.flush()
        async with self._lock:
            return await asyncio.to_thread(self._repair_order)

    def _repair_order(self) -> str:
        with self._writing(f"putting the rows of {self.uri} back in order"), self._exclusive:
            _ds, what = lance_order.repair(self._dataset())
            self._files.sync()
        self._ds, self._stored = self._dataset(), _ds.count_rows()
        return what

    async def maintain(self) -> None:
        """Compaction and old versions' cleanup without the append lock; a compaction's commit takes it (see
        lance_compaction)."""
        ds = self._ds
        if ds is None:
            return
        small = lance_compaction.small_fragments(ds, self.target_rows_per_fragment)
        now = time.monotonic()
        cleanup = now - self._last_cleanup >= self.cleanup_interval_seconds
        compact = small >= self.compact_min_fragments
        if not compact and not cleanup:
            return
        hold = compact and self._deferred >= lance_compaction.MAX_COMPACTION_DEFERRALS
        async with contextlib.AsyncExitStack() as locked:
            if hold:
                await locked.enter_async_context(self._lock)
                ds = self._ds or ds
            rewrites = await asyncio.to_thread(self._maintain, ds, small, cleanup)
            if not hold:
                await locked.enter_async_context(self._lock)
            if rewrites:
                landed = await asyncio.to_thread(self._commit_compaction, ds.version, rewrites)
                self._deferred = 0 if landed else self._deferred + 1
            # The newest version (readers of an older one would lose its files to a cleanup).
            self._ds = await asyncio.to_thread(self._dataset)
        if cleanup:
            self._last_cleanup = now

    async def aclose(self) -> None:
        await self.flush()

    # -- blocking helpers (run in a thread) ---------------------------------------------------------

    def _write(self, rows: list[dict[str, Any]], types: dict[str, pa.DataType]) -> lance.LanceDataset:
        return self._append(rows_to_table(rows, types))

    def _append(self, table: pa.Table) -> lance.LanceDataset:
        with self._writing(f"appending to {self.uri}"):
            if self._ds is None:  # big first appends too go in pieces (lance_parallel.create)
                options = self._options or None
                ds = lance_parallel.create(table, self.uri, self.encoders, options, session=shared_session())
            else:
                # A fresh handle: add_columns moves a dataset object in place, and readers in other
                # threads may still hold self._ds.
                ds = self._dataset()
                missing = [f for f in table.schema if f.name not in ds.schema.names]
                if missing:
                    with self._exclusive:
                        ds = self._dataset()
                        fields = [pa.field(f.name, f.type, nullable=True, metadata=f.metadata) for f in missing]
                        ds.add_columns([f for f in fields if f.name not in ds.schema.names])
                ds = lance_parallel.append(ds, table, self.encoders, self._options or None)
            self._files.sync()
        return ds

    def _rewrite(self, key: str, old: Layout, new: Layout) -> None:
        """Move a tensor field's column to a new layout (see the module docstring); runs under the lock."""
        log.info("%s: field %r moves from layout %s to %s (its column is rewritten)", self.uri, key, old, new)
        with self._writing(f"rewriting column {key!r} of {self.uri}"):
            with self._exclusive:
                rewrite_column(self._dataset(), key, old, new)
            self._files.sync()
        self._ds = self._dataset()

    def _finish_rewrites(self) -> None:
        """A rewrite a kill interrupted: undone while the old column is there, else completed (renamed)."""
        ds = self._ds
        if ds is None:
            return
        for column in interrupted_rewrites(ds):
            self._guard()
            try:
                finish_rewrite(ds, column)
                self._files.sync()
            except (OSError, ValueError, RuntimeError, pa.ArrowException) as exc:
                raise StorageError(f"finishing the rewrite of column {column!r} of {self.uri} failed: {exc}") from exc
            log.warning("%s: finished a column rewrite that was interrupted (%s)", self.uri, column)
        self._ds = self._dataset()

    def _maintain(self, ds: lance.LanceDataset, small: int, cleanup: bool) -> list[Any]:
        """On a worker thread, without the lock: the compaction's rewrite of ``ds`` (not committed) and the
        cleanup of old versions."""
        with self._writing(f"maintenance of {self.uri}"):
            rewrites = []
            if small >= self.compact_min_fragments:
                rewrites = lance_compaction.rewrite(ds, self.target_rows_per_fragment)
            if cleanup:
                # Never the newest version's files: a compaction committed later leaves the version before it whole.
                self._dataset().cleanup_old_versions(older_than=timedelta(seconds=self.retain_seconds))
                self._files.forget_removed()
        return rewrites

    def _commit_compaction(self, read_version: int, rewrites: list[Any]) -> bool:
        """Commit a compaction made from ``read_version`` unless an append landed since (lance_compaction)."""
        with self._writing(f"committing a compaction of {self.uri}"), self._exclusive:
            landed = lance_compaction.commit(self._dataset(), read_version, rewrites, self._local)
            if landed:
                self._files.sync()
        return landed

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Around every write to the dataset: the object store's lease checked first, Lance's errors translated."""
        self._guard()
        try:
            yield
        except PersistingError:
            raise
        except (OSError, ValueError, RuntimeError, pa.ArrowException) as exc:
            raise StorageError(f"{what} failed: {exc}") from exc

    def _dataset(self) -> lance.LanceDataset:
        return lance.dataset(self.uri, session=shared_session(), storage_options=self._options or None)
