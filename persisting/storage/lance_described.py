"""Stored rows described, not read: what ``get_meta``/``get_batch`` need to know of flushed samples (field kinds,
dtype and shape per sample) without reading the payload of their dense tensor fields.

A dense tensor column (fixed shape or scalar, see ``tensor_columns``) carries its dtype and sample shape in its
type and metadata, the same for every row. Whether a row has a value there is in the row's own field list
(``FIELDS_KEY``, written with every row since fields were recorded), so the column is not read at all; a dense
field the list names comes back as a ``Stored`` (kind, dtype, shape) in place of its value. Without that list
(rows stored before it existed) the rows are read whole, as ``get`` reads them. A variable-shape column (samples
of several shapes, jagged fields) keeps each sample's shape in a small child column of its own: only that child
is read (a null there is a row without a value), never the values beside it. Other columns are read as ``get``
reads them.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import StorageError
from ..tensors.column import storage_dtype
from ..tensors.jagged import KIND as JAGGED
from ..wire.codec import FIELDS_KEY
from . import lance_dense
from .backend import Stored
from .lance_columns import NULLS_COLUMN, REWRITE_PREFIX, column_name, key_name, table_to_rows
from .tensor_columns import FIXED, LAYOUT_KEY, SCALAR, VARIABLE, Layout


@functools.lru_cache(maxsize=256)
def stored_of(layout: Layout) -> Stored:
    """What a value of a fixed-shape or scalar column decodes to, without a value: numpy arrays name their dtype
    by its ``str`` (the codec keeps the array), torch tensors by the name written with the column."""
    return Stored(layout.kind, _dtype_name(layout), tuple(layout.shape) if layout.layout == FIXED else ())


def _dtype_name(layout: Layout) -> str:
    return storage_dtype("ndarray", layout.dtype_name).str if layout.kind == "ndarray" else layout.dtype_name


def _shaped(layout: Layout, column: pa.ChunkedArray) -> list[Stored | None]:
    """Each row's ``Stored`` from a variable-shape column read as its shape child only (None: the row has no
    value); a jagged sample's ragged dimension reads -1, as its description says."""
    dtype_name, ragged = _dtype_name(layout), layout.ragged if layout.kind == JAGGED else -1
    valid = column.is_valid().to_pylist()
    out: list[Stored | None] = []
    for ok, shape in zip(valid, pc.struct_field(column, "shape").to_pylist(), strict=True):
        if not ok or shape is None:
            out.append(None)
            continue
        if 0 <= ragged < len(shape):
            shape[ragged] = -1
        out.append(Stored(layout.kind, dtype_name, tuple(shape)))
    return out


def rows(ds: lance.LanceDataset, positions: np.ndarray, tensors: dict[str, Layout]) -> list[dict[str, Any]]:
    """The rows at ``positions`` (ascending) as ``LanceBackend.get`` gives them, except that tensor values of
    fixed-shape, scalar and variable-shape columns are ``Stored`` descriptions (see the module)."""
    dense, variable = {}, {}
    for field in ds.schema:  # this version's own layouts: a column rewrite may be moving ``tensors`` on meanwhile
        if not (field.metadata or {}).get(LAYOUT_KEY) or field.name.startswith(REWRITE_PREFIX):
            continue
        layout = Layout.of_field(field)
        if layout.layout in (FIXED, SCALAR) and layout.kind in ("ndarray", "tensor"):
            dense[key_name(field.name)] = layout
        elif layout.layout == VARIABLE and layout.kind in ("ndarray", "tensor", JAGGED):
            variable[key_name(field.name)] = layout
    names = ds.schema.names
    plain = [c for c in names if c == NULLS_COLUMN or (key_name(c) not in dense and key_name(c) not in variable)]
    shapes = [f"{column_name(name)}.shape" for name in variable]
    try:
        if FIELDS_KEY not in names or not (dense or variable):
            return table_to_rows(lance_dense.take_rows(ds, positions), tensors)
        table = lance_dense.take_by_fragment(ds, positions, plain + shapes)
        lists = table.column(FIELDS_KEY)
        if dense and lists.null_count:  # rows from before fields were recorded: nothing tells their nulls
            return table_to_rows(lance_dense.take_rows(ds, positions), tensors)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise StorageError(f"reading {ds.uri} failed: {exc}") from exc
    described = {name: _shaped(layout, table.column(column_name(name))) for name, layout in variable.items()}
    table = table.drop_columns([column_name(name) for name in variable])
    out = table_to_rows(table, {k: v for k, v in tensors.items() if k not in dense and k not in variable})
    found: dict[str, list[tuple[str, Stored]]] = {}  # a field list -> the dense fields it names (rows share few)
    for n, row in enumerate(out):
        raw = row.get(FIELDS_KEY) or ""  # none: rows before fields were recorded (only without dense fields)
        held = found.get(raw)
        if held is None:
            held = found[raw] = [(f, stored_of(dense[f])) for f in json.loads(raw) if f in dense] if raw else []
        for name, stored in held:
            row.setdefault(name, stored)  # an explicit None (the nulls column) stays None
        for name, each in described.items():
            if each[n] is not None:
                row.setdefault(name, each[n])
    return out
