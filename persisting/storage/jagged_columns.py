"""A jagged field's samples as Arrow: the ``variable_shape_tensor`` layout of ``tensor_columns``, per sample.

A jagged field (``tensors/jagged.py``) is stored one sample per row, ``struct<data: large_list<value>, shape:
list<int32>>`` with the sample row-major, so any Arrow reader gets each sample with its shape. For the usual ragged
dimension 0 the rows' data is the jagged tensor's values buffer itself (list offsets = the jagged offsets times
the product of the other dimensions): an arena batch reaches Lance without a copy in Python. A ragged dimension
other than 0 gathers each sample row-major (a copy). Row values of the copy path are joined into columns first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import CorruptionError
from ..tensors.column import Column
from ..tensors.jagged import KIND, JaggedColumn, assemble
from ..wire import codec


def runs(parts: Sequence[Any]) -> list[JaggedColumn | int]:
    """A jagged field's parts (columns of arena batches, or lists of row values) as runs: a column, or a count of
    nulls. Row values are joined per run of samples that share dtype, ragged dimension and other dimensions (a
    copy: they are rows of the copy path)."""
    out: list[JaggedColumn | int] = []
    pending: list[tuple[str, np.ndarray, int]] = []

    def close() -> None:
        if pending:
            col = assemble([a for _, a, _ in pending], pending[0][0], pending[0][2])
            if col is None:  # cannot happen: pending samples share their other dimensions
                raise CorruptionError("jagged samples that do not join")
            out.append(col)
            pending.clear()

    for part in parts:
        if isinstance(part, JaggedColumn):
            close()
            out.append(part)
            continue
        if isinstance(part, Column):
            raise CorruptionError("a dense column reached a jagged field")
        for value in part:
            if value is None:
                close()
                if out and isinstance(out[-1], int):
                    out[-1] += 1
                else:
                    out.append(1)
                continue
            dtype_name, arr, ragged = codec.decode_jagged(KIND, value)
            if pending:
                d0, a0, r0 = pending[0]
                here = (dtype_name, ragged, arr.ndim, arr.shape[:ragged] + arr.shape[ragged + 1 :])
                if (d0, r0, a0.ndim, a0.shape[:r0] + a0.shape[r0 + 1 :]) != here:
                    close()
            pending.append((dtype_name, arr, ragged))
    close()
    return out


def chunk(target: pa.DataType, col: JaggedColumn, values: np.ndarray) -> pa.Array:
    """``col``'s samples as variable-shape rows (``values``: its values as the Arrow value type's numpy array):
    over the values themselves for ragged dimension 0, else each sample gathered row-major (a copy)."""
    n, r = col.count, col.ragged_dim
    lengths = np.diff(col.offsets)
    inner = [int(d) for i, d in enumerate(col.values.shape) if i != r]
    per = int(np.prod(inner, dtype=np.int64)) * (2 if values.ndim > col.values.ndim else 1)
    if r == 0:
        flat = np.ascontiguousarray(values).reshape(-1)
    else:
        cut: list[slice] = [slice(None)] * values.ndim
        pieces = []
        for i in range(n):
            cut[r] = slice(int(col.offsets[i]), int(col.offsets[i + 1]))
            pieces.append(np.ascontiguousarray(values[tuple(cut)]).reshape(-1))
        flat = np.concatenate(pieces) if pieces else values.reshape(-1)[:0]
    offsets = pa.array(np.concatenate(([0], np.cumsum(lengths * per))).astype(np.int64))
    data = pa.LargeListArray.from_arrays(offsets, pa.array(flat))
    shapes = np.empty((n, len(inner) + 1), dtype=np.int32)
    shapes[:, [i for i in range(len(inner) + 1) if i != r]] = inner
    shapes[:, r] = lengths
    ndim = len(inner) + 1
    shape = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * ndim), pa.array(shapes.reshape(-1)))
    return pa.StructArray.from_arrays([data, shape], fields=list(target))


def encoded(col: JaggedColumn) -> pa.Array:
    """The codec's bytes of each sample (the ``bytes`` layout, for a field whose dtype or ragged dimension
    changed)."""
    one = [codec.encode_sample(KIND, col.dtype_name, col.sample(i), col.ragged_dim) for i in range(col.count)]
    return pa.array(one, type=pa.large_binary())
