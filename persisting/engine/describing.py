"""Describing samples for ``get_meta``/``get_batch``: each sample's fields with their kind, dtype and shape per
sample, and its tags, without reading tensor payloads where the description is known without them.

``Describer`` is composed into ``topic.Topic`` and owns one cache: the rows' descriptions of recent arena
batches. Arena batches are described from their columns in memory; flushed samples from their rows as
``Reader.rows_at(described=True)`` gives them: dense tensor fields (fixed shape, scalar) come from their column's
type, not their values (storage/lance_described), so describing a flushed batch of gigabytes reads its small columns
only. Other tensor layouts (variable shapes, jagged, bytes) are decoded from their values, as before.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

from ..storage.backend import Stored
from ..wire.codec import RESERVED_PREFIX, decode_jagged
from .index import SampleIndex
from .partitions import Clears
from .reader import Reader
from .schema import Schema
from .tail import Chunk

CHUNKS_DESCRIBED_KEPT = 16  # arena batches whose rows' descriptions are kept (the takes are at the front)


class Describer:
    def __init__(self, reader: Reader, index: SampleIndex, clears: Clears, schema: Schema) -> None:
        self._reader = reader
        self._index = index
        self._clears = clears
        self._schema = schema
        # the rows' descriptions of recent arena batches (id -> (batch, rows)): the one cache this class owns. The
        # batch by weak reference: a strong one kept the newest batches' payloads (their shared-memory segments,
        # their spool files) mapped in the broker after they were flushed and their memory given back.
        self._described: OrderedDict[int, tuple[weakref.ref[Chunk], list[Any], dict[str, list[Any]] | None]] = (
            OrderedDict()
        )

    async def describe(self, indexes: list[int], lenient: bool = False) -> list[list[Any]]:
        """Field descriptions of ``indexes``, run-length encoded: ``[[count, {field: [kind, dtype, shape]}
        [, tags]], ...]`` (dtype and per-sample shape for tensor fields, "" and [] for others; ``tags``: the
        samples' stored tags, absent when they have none). Samples of one batch share a run, so a meta of
        hundreds of samples costs one description per batch, not one per sample. Fields written later by patches
        are described from the rows that hold them.

        ``lenient`` (the answer to a take): a sample cleared while this reads (a purge may take its rows) is
        described with no fields instead of raising; ``get_data`` of it then says it was cleared."""
        if indexes and not self._clears.tags:
            # The usual answer to a take: samples of one arena batch, alike, untagged and never patched: one run.
            sources = (await self._index.field_index()).sources
            groups = self._reader.arena_groups(indexes)
            if len(groups) == 1 and not sources and (chunk := groups[0][0]) is not None and chunk.arena is not None:
                alike = self._arena_rows(chunk)[1]
                if alike is not None:
                    return [[len(indexes), alike]]
        descs = await self._describe_each(indexes, lenient)
        sources = (await self._index.field_index()).sources
        patched = [(n, sources[i]) for n, i in enumerate(indexes) if i in sources] if sources else []
        if patched:
            rows = sorted({src for _, written in patched for src in written.values()})
            found = dict(zip(rows, await self._describe_each(rows, lenient), strict=True))
            for n, written in patched:
                desc = dict(descs[n] or {})
                for name, src in written.items():
                    held = (found[src] or {}).get(name)
                    if held is not None:
                        desc[name] = held
                descs[n] = desc
        runs: list[list[Any]] = []
        tags = self._clears.tags
        last: list[Any] = []  # the run being extended: [count, description(, tags)]
        last_desc: Any = None
        last_tags: Any = None
        for index, entry in zip(indexes, descs, strict=True):
            tagged = tags.get(index) if tags else None
            if last and (last_desc is entry or last_desc == entry) and last_tags == tagged:
                last[0] += 1
                continue
            last = [1, entry or {}] if tagged is None else [1, entry or {}, tagged]
            last_desc, last_tags = last[1], tagged
            runs.append(last)
        return runs

    def _arena_rows(self, chunk: Chunk) -> tuple[list[dict[str, list[Any]] | None], dict[str, list[Any]] | None]:
        """The description of each row of an arena batch, and the one description all its rows share (None if
        they differ), made once per batch: the takes of one batch (a put of 64 samples, taken 16 at a time) share
        them. A batch's rows never change once put (patches are rows of their own), so what is kept stays true;
        kept for the newest CHUNKS_DESCRIBED_KEPT batches. Callers only read them."""
        hit = self._described.get(id(chunk))
        if hit is not None and hit[0]() is chunk:
            return hit[1], hit[2]
        arena = chunk.arena
        base = (
            {} if arena is None else {n: [c.kind, c.dtype_name, list(c.sample_shape)] for n, c in arena.columns.items()}
        )
        kinds = self._schema.kinds
        # Rows of one batch nearly always write the same fields: one description per set of fields written, shared
        # by its rows (describe() then joins them into one run by identity, not by comparing dicts).
        shared: dict[tuple[str, ...], dict[str, list[Any]]] = {}
        rows: list[dict[str, list[Any]] | None] = []
        for other in chunk.other:
            written = (
                (tuple(other) if None not in other.values() else tuple([k for k, v in other.items() if v is not None]))
                if other
                else ()
            )
            desc = shared.get(written)
            if desc is None:
                # the engine's columns (a keyed sample's key) are no fields
                own = {k: [kinds.get(k, ""), "", []] for k in written if not k.startswith(RESERVED_PREFIX)}
                desc = shared[written] = {**base, **own} if own else base
            rows.append(desc)
        alike = next(iter(shared.values())) if len(shared) == 1 else None
        self._described[id(chunk)] = (weakref.ref(chunk), rows, alike)
        if len(self._described) > CHUNKS_DESCRIBED_KEPT:
            self._described.popitem(last=False)
        return rows, alike

    async def _describe_each(self, indexes: list[int], lenient: bool = False) -> list[dict[str, list[Any]] | None]:
        """Each row's own field descriptions (samples of one arena batch share one dict)."""
        descs: list[dict[str, list[Any]] | None] = [None] * len(indexes)
        need: list[int] = []
        for chunk, at, count in self._reader.arena_groups(indexes):
            if chunk is None or chunk.arena is None:
                need.extend(range(at, at + count))
                continue
            first = indexes[at] - chunk.first
            descs[at : at + count] = self._arena_rows(chunk)[0][first : first + count]
        if need:
            rows, kinds = await self._reader.rows_at([indexes[n] for n in need], lenient, described=True)
            for n, row in zip(need, rows, strict=True):
                found: dict[str, list[Any]] = {}
                for name, value in row.items():
                    if name.startswith(RESERVED_PREFIX) or value is None:
                        continue
                    kind = kinds.get(name, "")
                    if isinstance(value, Stored):  # a flushed dense value: its column says what it holds
                        found[name] = [value.kind, value.dtype_name, list(value.shape)]
                    elif kind in ("ndarray", "tensor", "jagged"):
                        dtype_name, arr, ragged = decode_jagged(kind, value)
                        shape = list(arr.shape)
                        if kind == "jagged" and 0 <= ragged < len(shape):
                            shape[ragged] = -1
                        found[name] = [kind, dtype_name, shape]
                    else:
                        found[name] = [kind, "", []]
                descs[n] = found
        return descs
