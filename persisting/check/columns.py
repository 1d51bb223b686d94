"""Schema and layouts: every user column of every bucket has a kind (``schema.json``, or a log frame that carries
it until the next flush writes ``schema.json``), and its Arrow type is the one that kind and its layout metadata
(``persisting.layout``, storage/tensor_columns.py ``Layout``) give: what the reads decode by."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.compute as pc

from ..engine.keys import KEY_COLUMN
from ..errors import PersistingError
from ..storage.lance_columns import NULLS_COLUMN, REWRITE_PREFIX, finish_rewrite, key_name
from ..storage.tensor_columns import LAYOUT_KEY, Layout
from ..wire.codec import FIELDS_KEY, INDEX_KEY, OF_KEY, PARTITION_KEY, RESERVED_PREFIX
from .facts import Facts
from .report import TopicReport

# The temporary column of a layout rewrite as earlier versions named it (``<column>%23rewrite``, also the column of
# a user's key ``<key>#rewrite``: lance_columns' module docstring); a leftover one has no kind, its field has one.
OLD_REWRITE_SUFFIX = "%23rewrite"
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


def _old_rewrite_fixable(uri: Path, column: str, temporary: str) -> bool:
    """Whether ``finish_rewrite`` loses nothing: the old column is gone (renamed back), or it has a value wherever
    the temporary has one (dropped). Not so once this version wrote the field anew after the old one was dropped."""
    ds = lance.dataset(str(uri))
    if column not in ds.schema.names:
        return True
    table = ds.to_table(columns=[column, temporary])
    lost = pc.and_(pc.is_null(table.column(column)), pc.is_valid(table.column(temporary)))
    return not pc.any(lost).as_py()


def _old_rewrite_fix(uri: Path, column: str) -> Callable[[], str]:
    def fix() -> str:
        finish_rewrite(lance.dataset(str(uri)), column, column + OLD_REWRITE_SUFFIX)
        return f"{uri.name}: finished or undid the interrupted rewrite of {key_name(column)} (an earlier version's)"

    return fix


def check_columns(facts: Facts, report: TopicReport) -> None:
    kinds = {**facts.kinds, **facts.logged_kinds}
    for b, rows in enumerate(facts.buckets):
        if rows is None:
            continue
        name = f"bucket-{b}.lance"
        for field in rows.schema:
            if field.name in ENGINE_COLUMNS or field.name.startswith(REWRITE_PREFIX):
                continue  # (an interrupted rewrite is reported with the bucket)
            key = key_name(field.name)
            if key.startswith(RESERVED_PREFIX):
                report.note(name, f"column {key!r} is under the engine's prefix but not one it writes")
                continue
            kind = kinds.get(key)
            base = field.name.removesuffix(OLD_REWRITE_SUFFIX)
            if (
                kind is None
                and base != field.name
                and (field.metadata or {}).get(LAYOUT_KEY)
                and key_name(base) in kinds
            ):
                fixable = _old_rewrite_fixable(facts.folder / name, base, field.name)
                field_key = key_name(base)
                text = (
                    f"column {key!r} has no kind: it is the temporary column of a layout rewrite of {field_key!r} "
                    "that an earlier version left when killed"
                )
                if not fixable:
                    text += f", and {field_key!r} was written anew since: each column holds some rows' values"
                report.problem(name, text, _old_rewrite_fix(facts.folder / name, base) if fixable else None)
                continue
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
