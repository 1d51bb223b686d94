"""How a bucket's rows lie in a Lance table: one column per row key (percent-escaped where Lance refuses the
characters), typed by its first non-null value, and explicit ``None`` values listed in ``NULLS_COLUMN``.

Names of the engine's own (``NULLS_COLUMN``, a rewrite's temporary column) start with the reserved prefix
(wire/codec.py ``RESERVED_PREFIX``), which no user key may start with and ``column_name`` never produces from
another key, so no user key can be taken for one. Earlier versions named a rewrite's temporary column
``<column>%23rewrite``, the very column of the user key ``<key>#rewrite`` (an open dropped or renamed the user's
column, taking it for an interrupted rewrite): such columns are user columns now, in stores written before too (a
bucket cannot tell the two apart: only the topic's schema can), so a rewrite a kill interrupted in such a store
shows up as a field ``<key>#rewrite`` beside ``<key>`` (or in its place, after a kill past the drop) instead of
being finished at open; ``persisting-broker check`` tells it apart by the schema and repairs it
(persisting/check/columns.py).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import lance
import pyarrow as pa

from ..errors import ConfigError
from ..wire.codec import RESERVED_PREFIX
from . import tensor_columns
from .tensor_columns import Layout

NULLS_COLUMN = "_persisting_nulls"
# A column being rewritten into a new layout lives meanwhile under this prefix + its name (``rewrite_name``).
REWRITE_PREFIX = RESERVED_PREFIX + "rewrite_"
_LANCE_RESERVED_PREFIX = "_row"

ARROW_TYPES: dict[type, pa.DataType] = {
    bool: pa.bool_(),
    int: pa.int64(),
    float: pa.float64(),
    str: pa.large_string(),
    bytes: pa.large_binary(),
}


def column_name(key: str) -> str:
    """The on-disk column for a row key: reversible, and only characters Lance handles in names.

    Lance refuses '.', breaks on backticks and control characters, and reserves names starting with '_row' (as does this
    backend the name of its nulls column);
    anything but letters, digits, '_', '-', space and printable non-ASCII is percent-escaped (as is '%').
    """
    if not key:
        raise ConfigError("row keys must be non-empty strings")
    name = "".join(
        ch
        if (ch.isascii() and (ch.isalnum() or ch in "_- ")) or (not ch.isascii() and ch.isprintable())
        else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        for ch in key
    )
    if name.startswith(_LANCE_RESERVED_PREFIX) or name == NULLS_COLUMN:
        name = "%5F" + name[1:]
    return name


UNCOMPRESSED = {b"lance-encoding:compression": b"none"}


def payload_field(layout: Layout, column: str) -> pa.Field:
    """A tensor column's field as written: float payload uncompressed (pylance 14 stores the same bytes either way
    at the same CPU cost, ``python -m bench persist``; this keeps it so if a default changes); others as Lance
    chooses."""
    field = layout.field(column)
    name = layout.dtype_name  # a numpy dtype string ("<f4") or a torch dtype name ("bfloat16")
    if layout.layout == tensor_columns.BYTES or not ("float" in name or "complex" in name or name[1:2] in ("f", "c")):
        return field
    return field.with_metadata({**(field.metadata or {}), **UNCOMPRESSED})


def rewrite_name(column: str) -> str:
    """The temporary name of ``column`` while a rewrite moves it to a new layout."""
    return REWRITE_PREFIX + column


def key_name(column: str) -> str:
    return urllib.parse.unquote(column)


def rename(path: str, name: str) -> Any:
    return {"path": path, "name": name}  # lance's AlterColumn (a TypedDict of its own)


def table_to_rows(table: pa.Table, tensors: dict[str, Layout] | None = None) -> list[dict[str, Any]]:
    """Arrow rows back to dicts: nulls dropped unless listed as explicit None; tensor fields (``tensors``: their
    layouts) as the codec's row values."""
    tensors = tensors or {}
    names = [key_name(n) for n in table.column_names if n != NULLS_COLUMN]
    columns = [
        tensor_columns.row_values(tensors[name], table.column(n)) if name in tensors else table.column(n).to_pylist()
        for name, n in zip(names, [c for c in table.column_names if c != NULLS_COLUMN], strict=True)
    ]
    rows = [
        {name: value for name, value in zip(names, values, strict=True) if value is not None}
        for values in zip(*columns, strict=True)
    ]
    if len(rows) < table.num_rows:  # no value columns at all
        rows = [{} for _ in range(table.num_rows)]
    if NULLS_COLUMN in table.column_names:
        nulls = table.column(NULLS_COLUMN)
        if nulls.null_count < len(nulls):
            for row, keys in zip(rows, nulls.to_pylist(), strict=True):
                for key in keys or ():
                    row[key] = None
    return rows


def rewrite_column(ds: lance.LanceDataset, key: str, old: Layout, new: Layout) -> None:
    """Move a tensor field's column to a new layout in three commits: the new column added under a temporary
    name, the old one dropped, the new one renamed (``finish_rewrite`` completes or undoes a kill between them)."""
    column = column_name(key)
    temporary = rewrite_name(column)
    field = new.field(temporary)

    def converted(batch: pa.RecordBatch) -> pa.RecordBatch:
        array = tensor_columns.convert(old, new, batch.column(0))
        return pa.RecordBatch.from_arrays([array], schema=pa.schema([field]))

    if ds.count_rows():
        ds.add_columns(converted, read_columns=[column])
    else:  # every row deleted (a purge emptied the bucket): Lance has no batch to convert, the column is all null
        ds.add_columns([pa.field(temporary, field.type, nullable=True, metadata=field.metadata)])
    ds.drop_columns([column])
    ds.alter_columns(rename(temporary, column))


def interrupted_rewrites(ds: lance.LanceDataset) -> list[str]:
    """The columns whose rewrite a kill interrupted (a temporary column is left)."""
    return [n.removeprefix(REWRITE_PREFIX) for n in ds.schema.names if n.startswith(REWRITE_PREFIX)]


def finish_rewrite(ds: lance.LanceDataset, column: str, temporary: str | None = None) -> None:
    """Undo an interrupted rewrite while the old column is there, else complete it (rename the new one);
    ``temporary``: the new column's name if not ``rewrite_name(column)`` (an earlier version's, persisting/check)."""
    temporary = temporary or rewrite_name(column)
    if column in ds.schema.names:
        ds.drop_columns([temporary])
    else:
        ds.alter_columns(rename(temporary, column))


def rows_to_table(
    rows: list[dict[str, Any]],
    types: dict[str, pa.DataType],
    tensors: dict[str, tuple[pa.Field, pa.ChunkedArray]] | None = None,
) -> pa.Table:
    """Rows as a table: a column per key that has a value (``types``), the tensor columns built for them, and
    the explicit ``None`` keys of each row in ``NULLS_COLUMN``."""
    fields: list[pa.Field] = []
    arrays: list[Any] = []
    for key, t in types.items():
        values = [r.get(key) for r in rows]
        if any(v is not None for v in values):
            fields.append(pa.field(column_name(key), t))
            arrays.append(pa.array(values, type=t))
    for field, column in (tensors or {}).values():
        fields.append(field)
        arrays.append(column)
    nulls = [[k for k, v in r.items() if v is None] or None for r in rows]
    fields.append(pa.field(NULLS_COLUMN, pa.list_(pa.string())))
    arrays.append(pa.array(nulls, type=pa.list_(pa.string())))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
