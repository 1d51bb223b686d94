"""Dense tensor fields read from Lance as columns: the samples of a fixed-shape (or scalar) column at some
positions as arrays over the Arrow buffers Lance returns, with no value per sample on the way.

A fixed-shape tensor column is a fixed-size list whose values buffer holds the samples one after the other, so
the samples of a chunk are one numpy view of that buffer (``tensor_columns`` writes them so). A field is read
this way only where its column is one of those two layouts and holds no null; a column of another layout
(variable shapes, bytes, a jagged field) or with nulls among the rows asked for gives None, and the caller reads
that field through its rows.
"""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa

from ..errors import StorageError
from .lance_columns import column_name
from .tensor_columns import FIXED, SCALAR, Layout, from_arrow_values

DenseChunks = tuple[str, list[np.ndarray]] | None
"""A field's dtype name and its samples at the positions asked for, in order, in one or more arrays (batch
dimension first); None where the column cannot be read as columns."""


def layout_of(ds: lance.LanceDataset, name: str) -> Layout | None:
    """The layout of field ``name``'s column in ``ds`` if it is dense (fixed shape or scalar), else None."""
    column = column_name(name)
    if column not in ds.schema.names:
        return None
    layout = Layout.of_field(ds.schema.field(column))
    return layout if layout.layout in (FIXED, SCALAR) and layout.kind in ("ndarray", "tensor") else None


def take(ds: lance.LanceDataset, positions: np.ndarray, names: list[str]) -> dict[str, DenseChunks]:
    """The samples of each of ``names`` at ``positions`` (row positions in ``ds``): one Lance ``take`` of only the
    dense columns, then per chunk a view of its values (zero-copy), or None per field as the module says."""
    layouts = {name: layout_of(ds, name) for name in names}
    dense = {name: layout for name, layout in layouts.items() if layout is not None}
    out: dict[str, DenseChunks] = {name: None for name in names}
    if not dense:
        return out
    try:
        table = ds.take(positions, columns=[column_name(name) for name in dense])
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise StorageError(f"reading {ds.uri} failed: {exc}") from exc
    for name, layout in dense.items():
        column = table.column(column_name(name))
        if column.null_count:
            continue  # some of these samples have no value in this field: their rows say which
        try:
            out[name] = (layout.dtype_name, [chunk_samples(layout, chunk) for chunk in column.chunks if len(chunk)])
        except pa.ArrowException:
            continue  # values that are not one plain buffer (nulls inside a sample): read through the rows
    return out


def take_rows(ds: lance.LanceDataset, positions: np.ndarray) -> pa.Table:
    """Every column of the rows at ``positions`` (the row path: ``LanceBackend.get``)."""
    try:
        return ds.take(positions)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise StorageError(f"reading {ds.uri} failed: {exc}") from exc


def chunk_samples(layout: Layout, chunk: pa.Array) -> np.ndarray:
    """A chunk of a dense column without nulls as samples (n, *shape) in the field's storage dtype: a read-only
    view of the chunk's values buffer (a copy only for a byte order that is not native)."""
    n = len(chunk)
    if layout.layout == SCALAR:
        values = chunk.to_numpy(zero_copy_only=True)
    else:
        storage = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
        size = storage.type.list_size
        values = storage.values.slice(storage.offset * size, n * size).to_numpy(zero_copy_only=True)
    return from_arrow_values(layout, values, (n, *layout.shape))
