"""Reading a topic: rows by global index, and where a sample's fields lie (the tail, the arena, the backends).

``Reader`` is composed into ``topic.Topic`` and owns no state: it reads the tail (``Tail``), the backends
(``Buckets``, positions through their index columns, behind the purge's read gate), the sample index and the
cleared set. A sample's own fields are in the row its put wrote; a field written later (a patch, see fields.py)
is in the patch's row. A row is in the tail until it is flushed, then in its bucket's backend; the tensor fields
of a batch that came through the broker's arena stay in its extent (``arena_runs`` tells a broker client where,
so it makes views instead of reading copies) until the arena recycles the extent after its flush. ``sample_rows``
gives get_data their stored values (get_meta's field descriptions: describing.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from ..tensors.column import Column
from ..tensors.jagged import JaggedColumn
from ..wire.codec import INDEX_KEY
from . import columnar
from .buckets import Buckets
from .config import Metrics
from .index import SampleIndex
from .partitions import Clears
from .schema import Schema
from .tail import Chunk, Tail


def jagged_entry(name: str, col: JaggedColumn, i: int, count: int) -> list[Any]:
    """Where samples ``i .. i+count`` of a jagged arena column lie: ``[name, "jagged", dtype, sample shape,
    address, count, values along the ragged dimension from there, offsets (count + 1 int64 bytes, into those
    values)]``. Ragged dimension 0: just those samples' values; another: the whole values block (the samples
    are not contiguous in it)."""
    values = col.values
    addr = values.__array_interface__["data"][0]
    if col.ragged_dim == 0:  # the samples' own values (no column object per run: a selection makes many runs)
        lo, hi = int(col.offsets[i]), int(col.offsets[i + count])
        addr += lo * values.strides[0]
        offsets, total = col.offsets[i : i + count + 1] - lo, hi - lo
    else:
        offsets, total = col.offsets[i : i + count + 1], col.total
    return [name, col.kind, col.dtype_name, list(col.sample_shape), addr, count, total, offsets.tobytes()]


class Reader:
    def __init__(
        self,
        name: str,
        tail: Tail,
        buckets: Buckets,
        index: SampleIndex,
        clears: Clears,
        schema: Schema,
        metrics: Metrics,
    ) -> None:
        self._name = name
        self._tail = tail
        self._buckets = buckets
        self._index = index
        self._clears = clears
        self._schema = schema
        self._metrics = metrics

    async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Rows with global index in [offset, offset+limit), in index order, and the kinds to decode them."""
        rows, kinds, _end = await self.read_window(offset, limit)
        return rows, kinds

    async def read_window(
        self, offset: int, limit: int, described: bool = False
    ) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """``read``, and where the window ended: the next read starts there (rows of cleared samples are skipped,
        so a window may hold fewer rows than it spans). ``described``: see ``Buckets.read``."""
        async with self._clears.reading():  # a purge deleting rows (positions moving) waits for this read
            lo, hi = offset, min(offset + limit, self._tail.visible_upto)
            kinds = dict(self._schema.kinds)
            if lo >= hi:
                return [], kinds, lo
            flushed = self._tail.flushed_upto
            cleared = self._clears.cleared
            # The tail first: a flush may move it into the backends while we await them.
            tail_rows = self._tail.rows(lo, hi, cleared) if hi > flushed else []
            stored: list[dict[str, Any]] = []
            recent = self._tail.recent_rows(lo, min(hi, flushed), cleared) if lo < flushed else None
            if recent is not None:
                stored = recent
            elif lo < flushed:
                stored = await self._buckets.read(lo, min(hi, flushed), described)
                if cleared:
                    stored = [row for row in stored if row[INDEX_KEY] not in cleared]
            self._metrics.gets += 1
            self._metrics.records_read += len(stored) + len(tail_rows)
            return stored + tail_rows, kinds, hi

    async def field_values(self, indexes: list[int], name: str) -> dict[int, Any]:
        """One plain field's values for samples (arena batches: from memory; others: their rows)."""
        out: dict[int, Any] = {}
        need: list[int] = []
        for index in indexes:
            chunk = self._tail.arena_chunk(index)
            if chunk is not None:
                out[index] = chunk.other[index - chunk.first].get(name)
            else:
                need.append(index)
        if need:
            rows, _kinds = await self.rows_at(need)
            out.update((i, row.get(name)) for i, row in zip(need, rows, strict=True))
        return out

    def arena_runs(self, indexes: list[int], fields: list[str]) -> list[tuple[int, list[list[Any]]]] | None:
        """Where the tensor fields of ``indexes`` lie in the arena, if all of them do (else None).

        One entry per run of consecutive samples in one extent: (extent id, [[field, kind, dtype, shape,
        offset of the run's first sample, samples in the run, bytes per sample], ...]). Nothing awaits here, so
        the answer stays true until the caller's next await (a hold taken before it keeps it true after).
        """
        sources = self._index.fields.sources
        if sources and any(i in sources for i in indexes):
            # Some fields were written later by patches: each field's runs follow the rows that hold it.
            runs = []
            for name in fields:
                part = self._arena_field_runs([self._index.fields.source(i, name) for i in indexes], [name])
                if part is None:
                    return None
                runs.extend(part)
            return runs
        return self._arena_field_runs(indexes, fields)

    def spool_runs(self, indexes: list[int], fields: list[str]) -> list[tuple[str, list[list[Any]]]] | None:
        """Where the dense fields of ``indexes`` lie in spool files (``spooled.py``), if all of them do (else None,
        also for fields written later by patches): per run of consecutive samples in one file, (file name,
        [[field, kind, dtype, shape, file offset of the run's first sample, samples in the run, bytes per sample],
        ...]). Synchronous, like ``arena_runs``: true until the caller's next await."""
        sources = self._index.fields.sources
        if not fields or (sources and any(i in sources for i in indexes)):
            return None
        runs: list[tuple[str, list[list[Any]]]] = []
        for chunk, at, count in self.arena_groups(indexes):
            if chunk is None or chunk.arena is None or chunk.arena.extent_id >= 0:
                return None
            i = indexes[at] - chunk.first
            entries: list[list[Any]] = []
            for name in fields:
                col = chunk.arena.columns.get(name)
                if not isinstance(col, Column):
                    return None
                per = col.array.strides[0] if col.array.ndim else 0
                start = _file_offset(col.array) + i * per
                entries.append([name, col.kind, col.dtype_name, list(col.sample_shape), start, count, per])
            runs.append((str(chunk.arena.ref["spool"]), entries))
        return runs

    def _arena_field_runs(self, indexes: list[int], fields: list[str]) -> list[tuple[int, list[list[Any]]]] | None:
        runs: list[tuple[int, list[list[Any]]]] = []
        for chunk, at, count in self.arena_groups(indexes):
            if chunk is None or chunk.arena is None or chunk.arena.extent_id < 0:  # < 0: a spool file, not the arena
                return None
            i = indexes[at] - chunk.first
            entry_fields: list[list[Any]] = []
            for name in fields:
                col = chunk.arena.columns.get(name)
                if col is None:
                    return None
                if isinstance(col, JaggedColumn):
                    entry_fields.append(jagged_entry(name, col, i, count))
                    continue
                per = col.array.strides[0] if col.array.ndim else 0
                addr = col.array.__array_interface__["data"][0] + i * per
                entry_fields.append([name, col.kind, col.dtype_name, list(col.sample_shape), addr, count, per])
            runs.append((chunk.arena.extent_id, entry_fields))
        return runs

    def arena_groups(self, indexes: list[int]) -> list[tuple[Chunk | None, int, int]]:
        """``indexes`` cut into runs of consecutive indexes inside one arena batch: (batch or None, position in
        ``indexes``, length). One lookup per run, not per sample (a meta is usually one or a few batches)."""
        out: list[tuple[Chunk | None, int, int]] = []
        k, total = 0, len(indexes)
        while k < total:
            chunk = self._tail.arena_chunk(indexes[k])
            if chunk is None:
                out.append((None, k, 1))
                k += 1
                continue
            end = chunk.first + chunk.count
            j = k + 1
            while j < total and indexes[j] == indexes[j - 1] + 1 and indexes[j] < end:
                j += 1
            out.append((chunk, k, j - k))
            k = j
        return out

    async def rows_at(
        self, indexes: list[int], lenient: bool = False, described: bool = False
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Rows of arbitrary (sorted or not) indexes, in the order given; reads contiguous runs at once.
        ``lenient``: a row that is gone (its sample cleared meanwhile) comes back as ``{}`` instead of raising.
        ``described``: stored dense tensor values as descriptions (``Buckets.read``), for ``describing``."""
        if not lenient:
            self._clears.check_not_cleared(indexes)
        out: dict[int, dict[str, Any]] = {}
        kinds = dict(self._schema.kinds)
        ordered = sorted(set(indexes))
        k = 0
        while k < len(ordered):
            j = k
            while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
                j += 1
            rows, kinds, _end = await self.read_window(ordered[k], j - k + 1, described)
            for n, row in enumerate(rows):
                out[ordered[k] + n] = row
            k = j + 1
        missing = [i for i in indexes if i not in out]
        if missing and not lenient:
            raise ConfigError(f"topic {self._name!r} has no samples at global indexes {missing[:10]}")
        return [out.get(i, {}) for i in indexes], kinds

    async def plain_values(self, indexes: list[int], names: list[str]) -> list[dict[str, Any]]:
        """Stored values of non-tensor fields of samples, read beside the arena views without encoding any
        payload: from the arena batches' own rows where they lie there, else from the rows that hold them."""
        keep = set(names)
        out: list[dict[str, Any]] = []
        later: list[tuple[int, str, int]] = []  # (position, field, row holding it) to read from storage
        sources = self._index.fields.sources
        for n, index in enumerate(indexes):
            chunk = self._tail.arena_chunk(index)
            if chunk is None:
                out.append({})
                later.extend((n, name, self._index.fields.source(index, name)) for name in names)
                continue
            out.append({k: v for k, v in chunk.other[index - chunk.first].items() if k in keep})
            for name, src in sources.get(index, {}).items():
                if name not in keep:
                    continue
                holder = self._tail.arena_chunk(src)
                if holder is not None:
                    out[n][name] = holder.other[src - holder.first].get(name)
                else:
                    later.append((n, name, src))
        if later:
            need = sorted({src for _, _, src in later})
            rows, _kinds = await self.rows_at(need)
            by_index = dict(zip(need, rows, strict=True))
            for n, name, src in later:
                value = by_index[src].get(name)
                if value is None:
                    out[n].pop(name, None)
                else:
                    out[n][name] = value
        return out

    async def dense_values(self, indexes: list[int], fields: list[str]) -> dict[str, columnar.Dense]:
        """The dense tensor fields among ``fields`` of samples read as columns (columnar.py): per field (kind, dtype
        name, an array of the samples in the order given: read-only where it is what Lance returned: the
        caller copies it). Fields it cannot read so are left out (the caller reads them with ``sample_rows``)."""
        kinds = self._schema.kinds
        names = [f for f in fields if kinds.get(f) in ("ndarray", "tensor")]
        if not names or not indexes:
            return {}
        self._clears.check_not_cleared(indexes)
        found = await self._index.field_index()
        want = np.asarray(indexes, dtype=np.int64)
        patched = bool(found.sources) and any(i in found.sources for i in indexes)
        out = {f: columnar.DenseField(kinds[f], want) for f in names}
        if patched:  # each field from the rows that hold it
            for f in names:
                out[f].src = np.fromiter((found.source(i, f) for i in indexes), np.int64, len(want))
        groups: dict[bytes, list[str]] = {}  # fields held by the same rows: one take for them all
        for name, field in out.items():
            groups.setdefault(field.src.tobytes(), []).append(name)
        recent: list[np.ndarray] = []
        async with self._clears.reading():  # a purge (positions moving) waits for the takes
            flushed = self._tail.flushed_upto
            for group in groups.values():
                held = np.unique(out[group[0]].src)
                held = held[self._place_resident(held, [out[name] for name in group], group)]
                recent.append(held[held >= flushed])
                stored = held[held < flushed]
                taken = await self._buckets.take_dense(stored, group) if len(stored) else []
                for rows, part in taken if taken is not None else [(stored, dict.fromkeys(group))]:
                    for name in group:
                        out[name].place_chunks(rows, part[name])
        tail = np.unique(np.concatenate(recent))
        if len(tail) and not all(f.failed for f in out.values()):
            rows_in_tail, _kinds = await self.rows_at(tail.tolist())
            for name, field in out.items():
                field.place_rows(tail, [row.get(name) for row in rows_in_tail])
        return {name: dense for name, field in out.items() if (dense := field.result()) is not None}

    def _place_resident(self, rows: np.ndarray, out: list[columnar.DenseField], names: list[str]) -> np.ndarray:
        """Copy the fields ``names`` of ``rows`` (sorted) that lie in resident batches (the arena, a spool file)
        straight from there (now: nothing awaits, so the memory holds still); which of ``rows`` are left."""
        left = np.ones(len(rows), dtype=bool)
        for chunk, at, count in self.arena_groups(rows.tolist()):
            held = {} if chunk is None or chunk.arena is None else chunk.arena.columns
            cols = [col for n in names if isinstance(col := held.get(n), Column)]
            if chunk is None or len(cols) != len(names):
                continue  # not resident, or a field stored otherwise there: from the rows
            i = int(rows[at]) - chunk.first
            for field, col in zip(out, cols, strict=True):
                field.place(rows[at : at + count], col.dtype_name, col.array[i : i + count], borrow=False)
            left[at : at + count] = False
        return left

    async def sample_columns(
        self, indexes: list[int], fields: list[str]
    ) -> tuple[dict[str, columnar.Dense], list[dict[str, Any]], dict[str, str]]:
        """``sample_rows`` with the dense tensor fields read as columns where they can be (``dense_values``): (those
        fields, the rows of the others, the kinds to decode them)."""
        dense = await self.dense_values(indexes, fields)
        if dense and len(dense) == len(fields):
            return dense, [{} for _ in indexes], {}
        rows, kinds = await self.sample_rows(indexes, [f for f in fields if f not in dense])
        return dense, rows, kinds

    async def sample_rows(self, indexes: list[int], fields: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The stored values of ``fields`` of samples, each field from the latest row that wrote it (the sample
        itself, or a patch), in the order given."""
        rows, kinds = await self.rows_at(indexes)
        sources = (await self._index.field_index()).sources
        keep = set(fields)
        out = [{k: v for k, v in row.items() if k in keep} for row in rows]
        wanted = [
            (n, name, src) for n, i in enumerate(indexes) for name, src in sources.get(i, {}).items() if name in keep
        ]
        if wanted:
            need = sorted({src for _, _, src in wanted})
            patch_rows, kinds = await self.rows_at(need)
            by_index = dict(zip(need, patch_rows, strict=True))
            for n, name, src in wanted:
                out[n][name] = by_index[src].get(name)
        return out, kinds


def _file_offset(view: Any) -> int:
    """Where a view on a spool file's mapping (``spooled.columns_of``: one mapping of the whole file, at 0)
    starts in the file; correct for the slices a split batch keeps too."""
    root = view
    while isinstance(root.base, np.ndarray):
        root = root.base
    start = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return int(start + getattr(root, "offset", 0))
