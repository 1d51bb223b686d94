"""The engine's tail: put_batches waiting in memory until a flush moves them into the backends.

A chunk is one put_batch: its first global index, partition and rows. A tensor batch that went through the
broker's arena keeps its tensor fields as views on shared memory (``ArenaPayload``) instead of rows: its full
rows are encoded only if something needs them, and a flush hands its payload to the backend as views on the
arena (``tensor_parts``), which builds typed Arrow columns over that memory: no copy, no Python object per
sample. Such a batch goes to one bucket together (``whole_batch``), decided from what its log frame holds so
that a replay after a crash decides the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..tensors.column import Column
from ..wire.codec import encode_sample
from .fields import FieldIndex


@dataclass(slots=True)
class ArenaPayload:
    """The tensor fields of a batch that lives in the broker's arena: views, not copies.

    ``ref`` is what the log frame stores instead of the bytes (the arena generation, offsets, dtypes, shapes);
    ``columns`` are the views the tail serves until a flush writes them to the backends.
    """

    extent_id: int
    ref: dict[str, Any]
    columns: dict[str, Column]
    used: bool = False  # set once rows of the tail point at it


class Chunk:
    """One put_batch waiting in memory until it is flushed."""

    __slots__ = ("_rows", "arena", "count", "first", "of", "other", "partition", "patch_fields", "whole")

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


TYPED_KINDS = frozenset({"ndarray", "tensor", "nested"})  # fields a columnar backend stores typed


def tensor_parts(
    rows: list[dict[str, Any]], arena: list[tuple[int, Chunk, int]], kinds: dict[str, str]
) -> dict[str, tuple[str, list[Column | list[Any]]]]:
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
    out: dict[str, tuple[str, list[Column | list[Any]]]] = {}
    for key, kind in keys.items():
        parts: list[Column | list[Any]] = []
        pos = 0
        for start, chunk, skip in arena:
            if start > pos:
                parts.append([r.get(key) for r in rows[pos:start]])
            count = chunk.count - skip
            col = chunk.arena.columns.get(key) if chunk.arena is not None else None
            if col is not None:
                parts.append(Column(col.kind, col.dtype_name, col.array[skip:]))
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
            for i, row in enumerate(rows):
                row[name] = encode_sample(col.kind, col.dtype_name, col.array[i])
    return rows
