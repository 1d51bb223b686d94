"""Stored rows described, not read: what ``get_meta``/``get_batch`` need to know of flushed samples (field kinds,
dtype and shape per sample) without reading the payload of their dense tensor fields.

A dense tensor column (fixed shape or scalar, see ``tensor_columns``) carries its dtype and sample shape in its
type and metadata, the same for every row. Whether a row has a value there is in the row's own field list
(``FIELDS_KEY``, written with every row since fields were recorded), so only the other columns are read; a
dense field the list names comes back as a ``Stored`` (kind, dtype, shape) in place of its value. Without that
list (rows stored before it existed) the rows are read whole, as ``get`` reads them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from ..errors import StorageError
from ..tensors.column import storage_dtype
from ..wire.codec import FIELDS_KEY
from . import lance_dense
from .lance_columns import NULLS_COLUMN, key_name, table_to_rows
from .tensor_columns import FIXED, SCALAR, Layout


@dataclass(frozen=True, slots=True)
class Stored:
    """A dense tensor value left in storage: its kind, dtype name (as the decoded value names it) and shape."""

    kind: str
    dtype_name: str
    shape: tuple[int, ...]


@functools.lru_cache(maxsize=256)
def stored_of(layout: Layout) -> Stored:
    """What a value of a dense column decodes to, without a value: numpy arrays name their dtype by its ``str``
    (the codec keeps the array), torch tensors by the name written with the column."""
    dtype_name = layout.dtype_name
    if layout.kind == "ndarray":
        dtype_name = storage_dtype("ndarray", dtype_name).str
    return Stored(layout.kind, dtype_name, tuple(layout.shape) if layout.layout == FIXED else ())


def rows(ds: lance.LanceDataset, positions: np.ndarray, tensors: dict[str, Layout]) -> list[dict[str, Any]]:
    """The rows at ``positions`` (ascending) as ``LanceBackend.get`` gives them, except that dense tensor values
    are ``Stored`` descriptions (see the module)."""
    dense = {
        name: layout
        for name, layout in tensors.items()
        if layout.layout in (FIXED, SCALAR) and layout.kind in ("ndarray", "tensor")
    }
    names = ds.schema.names
    columns = [c for c in names if c == NULLS_COLUMN or key_name(c) not in dense]
    try:
        if not dense or FIELDS_KEY not in names:
            return table_to_rows(lance_dense.take_rows(ds, positions), tensors)
        table = lance_dense.take_by_fragment(ds, positions, columns)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise StorageError(f"reading {ds.uri} failed: {exc}") from exc
    lists = table.column(FIELDS_KEY)
    if lists.null_count:  # rows from before fields were recorded: no list to tell their nulls, read them whole
        return table_to_rows(lance_dense.take_rows(ds, positions), tensors)
    out = table_to_rows(table, {k: v for k, v in tensors.items() if k not in dense})
    found: dict[str, list[tuple[str, Stored]]] = {}  # a field list -> the dense fields it names (rows share few)
    for row in out:
        raw = row[FIELDS_KEY]
        held = found.get(raw)
        if held is None:
            held = found[raw] = [(n, stored_of(dense[n])) for n in json.loads(raw) if n in dense]
        for name, stored in held:
            row.setdefault(name, stored)  # an explicit None (the nulls column) stays None
    return out
