"""get_data's dense tensor fields as columns: one result array per field, filled from whole arrays of samples.

``Reader.dense_values`` finds, for each sample asked for, the row that holds each field (the sample's own row,
or the latest patch that wrote the field: fields.py) and takes the samples of those rows as arrays: from the
batch's memory while it is resident (the arena, a spool file), from Lance once flushed (``Buckets.take_dense``:
one take per bucket of only the columns asked for), else from the tail's rows. ``DenseField`` copies each array
into the field's one result, at the positions of the samples it holds; the one array that holds them all, in
order, is kept as it is instead (what Lance returned, read-only: ``batches.from_columns`` copies it for a
consumer, the broker sends it from there), and so are the arrays that hold them all in order, one per Lance
fragment (``Parts``: one reply frame each). Either way a consumer gets its own copy: its writes never reach what
is stored. Where one field cannot be read this way (a column of another layout, a sample without the field,
samples of different dtypes or shapes), that field alone is left to the row path (``Reader.sample_rows``): it
reads the same values, only slower.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensors.column import Parts, storage_dtype
from ..wire.codec import decode_sample

Dense = tuple[str, str, np.ndarray | Parts]
"""A field read as a column: (kind, dtype name, array of the samples asked for in the storage dtype, or the
arrays that hold them in order: ``Parts``)."""


class DenseField:
    """One field's result: ``src[k]`` is the row that holds sample ``k``'s value; ``place`` copies in samples of
    some rows. Complete once every position was filled by samples of one dtype and shape."""

    def __init__(self, kind: str, src: np.ndarray) -> None:
        self.kind = kind
        self.src = src
        self.dtype_name = ""
        self.array: np.ndarray | None = None
        self.parts: Parts | None = None  # several arrays that hold every sample in order (kept, not copied)
        self.filled = 0
        self.failed = False

    def place_chunks(self, rows: np.ndarray, got: tuple[str, list[np.ndarray]] | None) -> None:
        """Place what ``Buckets.take_dense`` read for ``rows`` (None: not as columns, so this field fails)."""
        if got is None:
            self.failed = True
            return
        chunks = got[1]
        if (
            self.array is None
            and len(chunks) > 1
            and np.array_equal(rows, self.src)
            and len({(c.dtype, c.shape[1:]) for c in chunks}) == 1
        ):
            # every sample asked for, in order, one array per Lance fragment: kept as they are (read-only; one
            # reply frame each), so the one copy is made where a consumer gathers them (see ``Parts``)
            self.dtype_name, self.parts, self.filled = got[0], Parts(chunks), len(rows)
            return
        at = 0
        for samples in got[1]:
            self.place(rows[at : at + len(samples)], got[0], samples)
            at += len(samples)

    def place(self, rows: np.ndarray, dtype_name: str, samples: np.ndarray, borrow: bool = True) -> None:
        """Copy in ``samples`` (one per entry of ``rows``: sorted global row indexes) where ``src`` names them.
        ``borrow``: samples that are all of the result, in order, are kept as they are, not copied (memory
        that stays valid: what Lance returned, not the arena)."""
        if self.failed or not len(rows):
            return
        if self.parts is not None:  # (not expected: samples come from two places) one array, then go on
            self.array, self.parts = self.parts.joined(), None
        pos = np.searchsorted(rows, self.src)
        hit = (pos < len(rows)) & (rows[np.minimum(pos, len(rows) - 1)] == self.src)
        at = np.flatnonzero(hit)
        if not len(at):
            return
        take = pos[at]
        whole = len(at) == len(self.src) and take[-1] - take[0] == len(take) - 1
        if self.array is None and whole and borrow:
            # every sample from one array, in order (a field of one piece of one batch): that array as it is,
            # read-only (the consumer's copy is made where it is kept)
            self.dtype_name, self.array, self.filled = dtype_name, samples[take[0] : take[-1] + 1], len(at)
            return
        if self.array is None:
            self.dtype_name = dtype_name
            self.array = np.empty((len(self.src), *samples.shape[1:]), dtype=samples.dtype)
        elif (
            (dtype_name, samples.shape[1:]) != (self.dtype_name, self.array.shape[1:])
            or not np.can_cast(samples.dtype, self.array.dtype, "equiv")  # (only the byte order may differ)
        ):
            self.failed = True  # samples of several dtypes or shapes: a list of samples, which the row path makes
            return
        if at[-1] - at[0] == len(at) - 1 and take[-1] - take[0] == len(take) - 1:
            self.array[at[0] : at[-1] + 1] = samples[take[0] : take[-1] + 1]  # one run: one copy
        else:
            self.array[at] = samples[take]
        self.filled += len(at)

    def place_rows(self, rows: np.ndarray, values: list[Any]) -> None:
        """Copy in the tail's encoded values of ``rows`` (sorted), stacked first when they agree."""
        if self.failed:
            return
        mine = np.isin(rows, self.src)
        decoded = [decode_sample(self.kind, v) for v, ok in zip(values, mine, strict=True) if ok and v is not None]
        if len(decoded) != int(mine.sum()) or len({(d, a.dtype, a.shape) for d, a in decoded}) > 1:
            self.failed = True  # a sample without this field, or samples that differ: the row path says it
            return
        if decoded:
            self.place(rows[mine], decoded[0][0], np.stack([a for _, a in decoded]))

    def result(self) -> Dense | None:
        held = self.parts if self.parts is not None else self.array
        if self.failed or held is None or self.filled != len(self.src):
            return None
        if not np.can_cast(
            (held[0] if isinstance(held, Parts) else held).dtype, storage_dtype(self.kind, self.dtype_name), "equiv"
        ):
            return None  # (not expected: a stored dtype name that says another dtype than its bytes)
        return self.kind, self.dtype_name, held
