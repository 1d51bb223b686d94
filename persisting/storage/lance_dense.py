"""Dense tensor fields read from Lance as columns: the samples of a fixed-shape (or scalar) column at some
positions as arrays over the Arrow buffers Lance returns, with no value per sample on the way.

A fixed-shape tensor column is a fixed-size list whose values buffer holds the samples one after the other, so
the samples of a chunk are one numpy view of that buffer (``tensor_columns`` writes them so). A field is read
this way only where its column is one of those two layouts and holds no null; a column of another layout
(variable shapes, bytes, a jagged field) or with nulls among the rows asked for gives None, and the caller reads
that field through its rows.

The rows are taken fragment by fragment (``LanceFragment.take`` with positions inside each fragment), not with
``LanceDataset.take``: for a fixed-size tensor column pylance 14 reads the former at 0.5-0.6 CPU s/GB (what a plain
``read`` of the files costs) and the latter at 1.5 (``python -m bench lance-read-apis``); both count positions
among the live rows (deleted rows skipped), so they take the same rows.
"""

from __future__ import annotations

import threading

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
        table = take_by_fragment(ds, positions, [column_name(name) for name in dense])
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


FRAGMENT_MAPS_KEPT = 4  # datasets whose fragment map is kept: the backend's current one and a few before it
# (id of the dataset object, its version) -> (that object, its fragments, the position each starts at). The object
# is kept with its map so that its id is not reused meanwhile; a version of one object never changes (an object
# that moves on in place, as ``delete`` does, has another version), and a dataset made anew at the same place is
# another object.
_maps: dict[tuple[int, int], tuple[lance.LanceDataset, list[lance.LanceFragment], np.ndarray]] = {}
_maps_lock = threading.Lock()


def fragment_map(ds: lance.LanceDataset) -> tuple[list[lance.LanceFragment], np.ndarray]:
    """The fragments of ``ds`` in position order and the position each starts at (one more entry: the total),
    made once per dataset object and version (counting rows reads deletion files)."""
    key = (id(ds), ds.version)
    with _maps_lock:
        found = _maps.get(key)
    if found is not None:
        return found[1], found[2]
    fragments = ds.get_fragments()
    starts = np.zeros(len(fragments) + 1, dtype=np.int64)
    np.cumsum([f.count_rows() for f in fragments], out=starts[1:])
    with _maps_lock:
        while len(_maps) >= FRAGMENT_MAPS_KEPT:
            _maps.pop(next(iter(_maps)))
        _maps[key] = (ds, fragments, starts)
    return fragments, starts


def take_by_fragment(ds: lance.LanceDataset, positions: np.ndarray, columns: list[str]) -> pa.Table:
    """``ds.take(positions, columns=columns)`` as one take per fragment holding some (``positions`` ascending;
    any other order goes to ``ds.take``): the same rows, in that order, one chunk (or more) per fragment."""
    positions = np.asarray(positions, dtype=np.int64)
    if not len(positions) or bool((np.diff(positions) <= 0).any()):
        return ds.take(positions, columns=columns)
    fragments, starts = fragment_map(ds)
    if positions[0] < 0 or positions[-1] >= starts[-1]:
        raise ValueError(f"positions {positions[0]}..{positions[-1]} outside the {starts[-1]} rows of the dataset")
    at = np.searchsorted(starts, positions, "right") - 1  # the fragment of each position
    cuts = np.flatnonzero(np.diff(at)) + 1
    parts = [
        fragments[int(at[a])].take(positions[a:b] - starts[at[a]], columns=columns)
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(positions)], strict=True)
    ]
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


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
