"""The engine's tail: put_batches waiting in memory until a flush moves them into the backends.

A chunk is one put_batch: its first global index, partition and rows. A tensor batch that went through the
broker's arena keeps its tensor fields as views on shared memory (``ArenaPayload``) instead of rows: its full
rows are encoded only if something needs them, and a flush hands its payload to the backend as views on the
arena (``tensor_parts``), which builds typed Arrow columns over that memory: no copy, no Python object per
sample. Such a batch goes to one bucket together (``whole_batch``), decided from what its log frame holds so
that a replay after a crash decides the same.

``Tail`` owns the chunks and the three marks that bound them (global indexes)::

    0 .......... flushed_upto .......... visible_upto .......... next_index
    | in the backends |  acknowledged, readable  |  logged, waiting for |
    | (and resident   |  (chunks in the tail)    |  their group commit  |
    |  arena batches) |                          |                      |

A put takes indexes at ``next_index`` (``assign``), is made visible by ``acknowledge`` once its log frame is
committed (waking whoever waits in ``changed``), and a flush moves chunks below a cut into the backends
(``flushed``). Flushed arena batches stay *resident* (their extents mapped) until the arena reuses the extent.
The other flushed chunks stay *recent* (their rows in memory, up to ``RECENT_ROWS`` rows and about
``RECENT_BYTES``, estimated from each chunk's first row) so that a reader a little behind the writers reads them
from memory instead of from the backends: without them a consumer that lags by one flush pays a Lance read per
page, falls further behind, and a faster writer (``durability="process"``) makes its consumers slower than a
durable one.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..tensors.column import AnyColumn
from ..tensors.jagged import JaggedColumn
from ..wire.codec import encode_sample
from .fields import FieldIndex

RECENT_ROWS = int(os.environ.get("PERSISTING_RECENT_ROWS", "262144"))  # flushed rows kept readable in memory
RECENT_BYTES = int(os.environ.get("PERSISTING_RECENT_BYTES", str(64 * 1024 * 1024)))  # ... and about this much


@dataclass(slots=True)
class ArenaPayload:
    """The tensor fields of a batch that lives in the broker's arena: views, not copies.

    ``ref`` is what the log frame stores instead of the bytes (the arena generation, offsets, dtypes, shapes);
    ``columns`` are the views the tail serves until a flush writes them to the backends.
    """

    extent_id: int  # < 0: not in the arena but in a spool file (spooled.py)
    ref: dict[str, Any]
    columns: dict[str, AnyColumn]
    used: bool = False  # set once rows of the tail point at it
    on_stored: Callable[[], None] | None = None  # a spool file's: called once the backends hold it durably


class Chunk:
    """One put_batch waiting in memory until it is flushed."""

    # __weakref__: the describer's cache names a chunk without keeping it (and its payload's memory) alive
    __slots__ = ("__weakref__", "_rows", "arena", "count", "first", "of", "other", "partition", "patch_fields", "whole")

    def __init__(
        self,
        first: int,
        partition: str,
        rows: list[dict[str, Any]],
        arena: ArenaPayload | None = None,
        whole: bool = False,
        patch: tuple[list[int], list[str]] | None = None,
    ) -> None:
        self.first = first
        self.partition = partition
        self.count = len(rows)
        self.arena = arena
        # A patch (fields written for existing samples): row k adds ``patch_fields`` to sample ``of[k]``.
        self.of: list[int] | None = patch[0] if patch is not None else None
        self.patch_fields: list[str] = patch[1] if patch is not None else []
        # An arena batch (live, or replayed from its log frame): it goes to one bucket whole, see _whole_batch.
        self.whole = whole or arena is not None
        # An arena batch keeps its non-tensor rows apart; its full rows are made only when needed (a flush).
        self._rows: list[dict[str, Any]] | None = None if arena is not None else rows
        self.other = rows

    def forget_rows(self) -> None:
        if self.arena is not None:
            self._rows = None  # the encoded copy served its flush

    def own_fields_id(self, i: int, index: FieldIndex) -> int:
        """The field-set id (in ``index``) of the fields sample ``first + i`` of this chunk was written with."""
        extra = tuple(self.arena.columns) if self.arena is not None else ()
        return index.row_id(self.other[i], extra)

    @property
    def encoded(self) -> bool:
        return self._rows is not None

    def encode(self, a: int, b: int) -> list[dict[str, Any]]:
        """Rows ``a .. b`` of an arena batch, encoded now and not kept (a read of part of a big batch)."""
        arena = self.arena
        if arena is None:
            return self.rows[a:b]
        part = ArenaPayload(arena.extent_id, arena.ref, {k: c.rows(a, b) for k, c in arena.columns.items()})
        return materialize(self.other[a:b], part)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Storage rows; for an arena batch its tensor samples are encoded (copied) here, on first use."""
        if self._rows is None:
            self._rows = materialize(self.other, self.arena)
        return self._rows


def whole_batch(chunk: Chunk, bucket_column: str) -> bool:
    """Whether a batch goes to one bucket (``layout.batch_bucket``): an arena batch none of whose samples has
    a value in the bucket column. Decided from what its log frame holds, so a replay decides the same."""
    arena = chunk.arena
    return (
        chunk.whole
        and (arena is None or bucket_column not in arena.columns)
        and all(row.get(bucket_column) is None for row in chunk.other)
    )


TYPED_KINDS = frozenset({"ndarray", "tensor", "jagged", "nested"})  # fields a columnar backend stores typed


def tensor_parts(
    rows: list[dict[str, Any]], arena: list[tuple[int, Chunk, int]], kinds: dict[str, str]
) -> dict[str, tuple[str, list[AnyColumn | list[Any]]]]:
    """For each tensor (or nested) field of one bucket's ``rows``: (kind, parts covering the rows in order), for
    a backend's ``put_columns``. An arena batch contributes its column sliced past the samples it skips (a view
    on shared memory: the backend builds its Arrow column over it, no copy); other rows contribute their own
    values (encoded bytes or None). ``arena``: (position in ``rows``, arena batch, samples skipped), in order."""
    keys: dict[str, str] = {}
    for _pos, chunk, _skip in arena:
        if chunk.arena is not None:
            keys.update((name, col.kind) for name, col in chunk.arena.columns.items())
    present = {k for r in rows for k in r}  # one C-level pass; rows of tensor-only batches hold engine keys only
    keys.update((k, kinds[k]) for k in present if kinds.get(k) in TYPED_KINDS and k not in keys)
    out: dict[str, tuple[str, list[AnyColumn | list[Any]]]] = {}
    for key, kind in keys.items():
        parts: list[AnyColumn | list[Any]] = []
        pos = 0
        for start, chunk, skip in arena:
            if start > pos:
                parts.append([r.get(key) for r in rows[pos:start]])
            count = chunk.count - skip
            col = chunk.arena.columns.get(key) if chunk.arena is not None else None
            if col is not None:
                parts.append(col.rows(skip))
            else:  # a field of the batch's other rows (a list per sample), or one it lacks
                parts.append([r.get(key) for r in rows[start : start + count]])
            pos = start + count
        if pos < len(rows):
            parts.append([r.get(key) for r in rows[pos:]])
        out[key] = (kind, parts)
    return out


def materialize(other: list[dict[str, Any]], arena: ArenaPayload | None) -> list[dict[str, Any]]:
    rows = [dict(r) for r in other]
    if arena is not None:
        for name, col in arena.columns.items():
            ragged = col.ragged_dim if isinstance(col, JaggedColumn) else 0
            for i, row in enumerate(rows):
                row[name] = encode_sample(col.kind, col.dtype_name, col.sample(i), ragged)
    return rows


class Tail:
    """The chunks waiting for a flush, the flushed arena batches still resident, and the marks (see above)."""

    def __init__(self) -> None:
        self.next_index = 0
        self.visible_upto = 0  # every index below is acknowledged and readable
        self.flushed_upto = 0  # every index below is in the backends
        self.chunks: list[Chunk] = []
        self._firsts: list[int] = []
        self._resident: list[Chunk] = []
        self._resident_firsts: list[int] = []
        self._recent: list[Chunk] = []  # flushed plain chunks, oldest first (see the module docstring)
        self._recent_firsts: list[int] = []
        self._recent_sizes: list[tuple[int, int]] = []  # (rows, approximate bytes) of each
        self._recent_rows = 0
        self._recent_bytes = 0
        self._changed: asyncio.Event | None = None  # made by the first waiter: a put nobody waits for makes none

    # -- marks --------------------------------------------------------------------------------------

    def start(self, flushed_upto: int, next_index: int) -> None:
        """At open, after the replay: everything logged counts as acknowledged."""
        self.flushed_upto = flushed_upto
        self.next_index = self.visible_upto = next_index

    def assign(self, count: int) -> int:
        """Take ``count`` indexes for a put; returns the first."""
        first = self.next_index
        self.next_index = first + count
        return first

    def acknowledge(self, upto: int) -> bool:
        """Rows below ``upto`` are committed: readable now; wakes ``changed`` waiters. False if nothing moved."""
        if upto <= self.visible_upto:
            return False
        self.visible_upto = upto
        self.wake()
        return True

    def wake(self) -> None:
        """Wake everything waiting in ``changed`` (a put became visible, or the topic closes)."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def changed(self, timeout: float | None) -> None:
        """Wait until the next ``wake`` or ``timeout`` seconds."""
        changed = self._changed
        if changed is None:
            changed = self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)

    # -- chunks -------------------------------------------------------------------------------------

    def add(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        if chunk.arena is not None:
            chunk.arena.used = True
        self._firsts.append(chunk.first)

    def below(self, cut: int) -> list[Chunk]:
        """The chunks starting below ``cut`` (what a flush up to ``cut`` takes)."""
        return self.chunks[: bisect.bisect_left(self._firsts, cut)]

    def flushed(self, chunks: list[Chunk], cut: int) -> None:
        """``chunks`` (the front of the tail) are in the backends now, and every index below ``cut``."""
        for chunk in chunks:
            if chunk.arena is not None and chunk.arena.extent_id >= 0:
                # Flushed, but its extent stays mapped until the arena needs the space: consumers keep getting
                # views instead of reading the payload back from the backends.
                chunk.forget_rows()
                self._resident.append(chunk)
                self._resident_firsts.append(chunk.first)
            elif chunk.arena is None or chunk.encoded:
                self._keep_recent(chunk)
            # else a spooled batch (larger than the arena) never encoded into rows: read from the backends from now
            # on. Encoding its rows to keep them here cost 4x the batch in the broker's RSS (8.5 GiB for 2 GiB) and
            # the CPU to do it, during the first read after the flush, only for RECENT_BYTES to drop them at once.
        del self.chunks[: len(chunks)]
        del self._firsts[: len(chunks)]
        self.flushed_upto = cut

    def _keep_recent(self, chunk: Chunk) -> None:
        rows = chunk.rows
        size = (chunk.count, chunk.count * _row_bytes(rows[0]) if rows else 0)
        self._recent.append(chunk)
        self._recent_firsts.append(chunk.first)
        self._recent_sizes.append(size)
        self._recent_rows += size[0]
        self._recent_bytes += size[1]
        drop = 0
        rows_left, bytes_left = self._recent_rows, self._recent_bytes
        while rows_left > RECENT_ROWS or bytes_left > RECENT_BYTES:
            rows_left -= self._recent_sizes[drop][0]
            bytes_left -= self._recent_sizes[drop][1]
            drop += 1
        if drop:
            del self._recent[:drop], self._recent_firsts[:drop], self._recent_sizes[:drop]
            self._recent_rows, self._recent_bytes = rows_left, bytes_left

    def recent_rows(self, lo: int, hi: int, cleared: set[int]) -> list[dict[str, Any]] | None:
        """The flushed rows with index in ``[lo, hi)`` (``hi`` at most ``flushed_upto``) from the recent chunks, in
        order, without ``cleared`` ones; None unless the recent chunks hold every index of the range."""
        k = bisect.bisect_right(self._recent_firsts, lo) - 1
        if k < 0:
            return None
        out: list[dict[str, Any]] = []
        pos = lo
        recent = self._recent
        # By position, not a slice: ``recent[k:]`` copies every chunk past k (one per put when puts come one by
        # one), which made reading the oldest rows linear in the rows kept.
        for j in range(k, len(recent)):
            chunk = recent[j]
            if pos >= hi:
                break
            if chunk.first > pos or chunk.first + chunk.count <= pos:
                return None  # a gap: an arena batch, or rows older than the recent ones
            a, b = pos - chunk.first, min(hi - chunk.first, chunk.count)
            rows = chunk.rows
            if cleared:
                out.extend(r for i, r in enumerate(rows[a:b], chunk.first + a) if i not in cleared)
            else:
                out.extend(rows[a:b])
            pos = chunk.first + b
        return out if pos >= hi else None

    def has_arena(self) -> bool:
        return any(c.arena is not None for c in self.chunks)

    def step_cut(self, cut: int, step_bytes: int) -> int:
        """The first index of the chunk past ``step_bytes`` of arena payload (at least one chunk goes)."""
        total = 0
        chunks = self.chunks
        for k, chunk in enumerate(chunks):
            if chunk.first >= cut:
                break
            if chunk.arena is not None:
                total += sum(col.nbytes for col in chunk.arena.columns.values())
                if total > step_bytes and k + 1 < len(chunks):
                    return min(cut, chunks[k + 1].first)
        return cut

    def rows(self, lo: int, hi: int, cleared: set[int]) -> list[dict[str, Any]]:
        """The tail's rows with index in ``[max(lo, flushed_upto), hi)``, in order, without ``cleared`` ones."""
        out: list[dict[str, Any]] = []
        start = max(lo, self.flushed_upto)
        if hi <= start:
            return out
        k = max(0, bisect.bisect_right(self._firsts, start) - 1)
        chunks = self.chunks
        for j in range(k, len(chunks)):  # by position: a slice would copy every chunk past k (see recent_rows)
            chunk = chunks[j]
            if chunk.first >= hi:
                break
            a = max(start - chunk.first, 0)
            b = min(hi - chunk.first, chunk.count)
            # An arena (or spooled) batch not encoded yet: only the rows asked for, not the whole batch.
            rows = chunk.rows[a:b] if chunk.arena is None or chunk.encoded else chunk.encode(a, b)
            if a < b and cleared:
                out.extend(r for i, r in enumerate(rows, chunk.first + a) if i not in cleared)
            elif a < b:
                out.extend(rows)
        return out

    def chunk_at(self, index: int) -> Chunk | None:
        """The acknowledged, unflushed chunk holding ``index``."""
        if index < self.flushed_upto or index >= self.visible_upto:
            return None
        k = bisect.bisect_right(self._firsts, index) - 1
        if k < 0:
            return None
        chunk = self.chunks[k]
        return chunk if chunk.first <= index < chunk.first + chunk.count else None

    def arena_chunk(self, index: int) -> Chunk | None:
        """The arena batch holding ``index``: in the tail, or flushed and still resident in the arena."""
        chunk = self.chunk_at(index)
        if chunk is None and index < self.flushed_upto:
            k = bisect.bisect_right(self._resident_firsts, index) - 1
            if k >= 0:
                found = self._resident[k]
                if found.first <= index < found.first + found.count:
                    chunk = found
        return chunk if chunk is not None and chunk.arena is not None else None

    def forget_arena(self, extent_id: int) -> None:
        """The arena reuses this extent: its (flushed) samples are read from the backends from now on."""
        for k, chunk in enumerate(self._resident):
            if chunk.arena is not None and chunk.arena.extent_id == extent_id:
                del self._resident[k]
                del self._resident_firsts[k]
                return


def _row_bytes(row: dict[str, Any]) -> int:
    """About how much memory a row holds: a dict, and per value its length (str, bytes) and an object's overhead."""
    return 100 + sum(50 + (len(v) if isinstance(v, str | bytes) else 8) for v in row.values())
