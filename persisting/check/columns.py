"""Schema and layouts: every user column of every bucket has a kind (``schema.json``, or a log frame that carries
it until the next flush writes ``schema.json``), and its Arrow type is the one that kind and its layout metadata
(``persisting.layout``, storage/tensor_columns.py ``Layout``) give: what the reads decode by."""

from __future__ import annotations

import pyarrow as pa

from ..engine.keys import KEY_COLUMN
from ..errors import PersistingError
from ..storage.lance_columns import NULLS_COLUMN, REWRITE_SUFFIX, key_name
from ..storage.tensor_columns import LAYOUT_KEY, Layout
from ..wire.codec import FIELDS_KEY, INDEX_KEY, OF_KEY, PARTITION_KEY, RESERVED_PREFIX
from .facts import Facts
from .report import TopicReport

ENGINE_COLUMNS = {INDEX_KEY, PARTITION_KEY, OF_KEY, FIELDS_KEY, NULLS_COLUMN, KEY_COLUMN}
PLAIN_TYPES = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "str": pa.large_string()}


def _layout_problem(field: pa.Field, kind: str) -> str | None:
    """What is wrong with a column of layout metadata, None if nothing."""
    try:
        layout = Layout.of_field(field)
        expected = layout.arrow_type()
    except (PersistingError, ValueError, TypeError, KeyError, IndexError) as exc:
        return f"its layout metadata cannot be read: {exc}"
    if expected != field.type:
        return f"layout {layout.layout!r} stores {expected}, the column is {field.type}"
    if layout.kind and layout.kind != kind:
        return f"its layout metadata says kind {layout.kind!r}, the schema {kind!r}"
    return None


def check_columns(facts: Facts, report: TopicReport) -> None:
    kinds = {**facts.kinds, **facts.logged_kinds}
    for b, rows in enumerate(facts.buckets):
        if rows is None:
            continue
        name = f"bucket-{b}.lance"
        for field in rows.schema:
            if field.name in ENGINE_COLUMNS or field.name.endswith(REWRITE_SUFFIX):
                continue  # (an interrupted rewrite is reported with the bucket)
            key = key_name(field.name)
            if key.startswith(RESERVED_PREFIX):
                report.note(name, f"column {key!r} is under the engine's prefix but not one it writes")
                continue
            kind = kinds.get(key)
            if kind is None:
                report.problem(
                    name, f"column {key!r} has no kind in schema.json nor in the log: its values cannot be decoded"
                )
                continue
            if (field.metadata or {}).get(LAYOUT_KEY):
                wrong = _layout_problem(field, kind)
            else:
                expected = PLAIN_TYPES.get(kind, pa.large_binary())
                wrong = None if field.type == expected else f"kind {kind!r} is stored as {expected}, not {field.type}"
            if wrong is not None:
                report.problem(name, f"column {key!r}: {wrong}")
