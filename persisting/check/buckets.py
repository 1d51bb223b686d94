"""The buckets (``bucket-<i>.lance``): what the engine's open repairs and what it refuses, found without writing.

Per bucket: empty manifests (a commit a power loss cut; Lance cannot open past them), a folder with no committed
version (a kill during its first write: its rows are still in the log), a column rewrite a kill interrupted,
data files no version refers to (an append whose commit never came), and the row order: ``_persisting_index``
must strictly increase in position order (storage/lance_order.py says what is wrong and puts it back). Each
repair is the engine's own: ``lance_files.recover_folder`` (what ``LanceBackend``'s open does),
``lance_columns.finish_rewrite``, ``lance_parallel.remove_orphans``, ``lance_order.repair``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from ..engine.keys import KEY_COLUMN
from ..storage import lance_order
from ..storage.lance_columns import finish_rewrite, interrupted_rewrites, key_name
from ..storage.lance_files import has_manifest, recover_folder
from ..storage.lance_parallel import remove_orphans
from ..wire.codec import INDEX_KEY, OF_KEY, PARTITION_KEY
from .facts import BucketRows, Facts
from .report import TopicReport

RETAIN_SECONDS = 10.0  # old versions a repair's cleanup keeps (LanceBackend's default retain_seconds)
_BUCKET = re.compile(r"^bucket-(\d+)\.lance$")


def _done(action: Callable[[], object], line: str) -> Callable[[], str]:
    def fix() -> str:
        action()
        return line

    return fix


def _empty_manifests(uri: Path) -> list[str]:
    versions = uri / "_versions"
    if not versions.is_dir():
        return []
    return sorted(e.name for e in os.scandir(versions) if e.is_file() and e.stat().st_size == 0)


def _orphans(uri: Path, ds: lance.LanceDataset) -> list[str]:
    """Data files that no version of the dataset refers to."""
    data = uri / "data"
    if not data.is_dir():
        return []
    referenced: set[str] = set()
    for version in ds.versions():
        for fragment in lance.dataset(str(uri), version=version["version"]).get_fragments():
            referenced.update(f.path for f in fragment.data_files())
    return sorted(e.name for e in os.scandir(data) if e.is_file() and e.name not in referenced)


def _order_fix(uri: Path) -> Callable[[], str]:
    def fix() -> str:
        _, done = lance_order.repair(lance.dataset(str(uri)))
        return f"{uri.name}: {done}"

    return fix


def _rewrites_fix(uri: Path, columns: list[str]) -> Callable[[], str]:
    def fix() -> str:
        for column in columns:
            finish_rewrite(lance.dataset(str(uri)), column)
        return f"{uri.name}: finished or undid the interrupted rewrite of {', '.join(map(key_name, columns))}"

    return fix


def _bucket(facts: Facts, report: TopicReport, b: int) -> BucketRows | None:
    name = f"bucket-{b}.lance"
    uri = facts.folder / name
    if not uri.exists():
        return None
    empty = _empty_manifests(uri)
    if empty:
        report.problem(
            name,
            f"{len(empty)} empty manifest(s) (a commit a power loss cut): Lance cannot open the dataset past them",
            _done(lambda: recover_folder(uri), f"{name}: removed {len(empty)} empty manifest(s)"),
        )
    facts.unread.append(name)  # until it is read below
    if not has_manifest(uri):
        report.problem(
            name,
            "no committed version (a kill during the bucket's first write): nothing was stored in it, its rows are "
            "in the log",
            _done(lambda: recover_folder(uri), f"{name}: removed the folder of a bucket that never held a row"),
        )
        return None
    try:
        ds = lance.dataset(str(uri))
        table = ds.to_table(columns=[c for c in (INDEX_KEY, PARTITION_KEY, OF_KEY, KEY_COLUMN) if c in ds.schema.names])
    except (OSError, ValueError, RuntimeError) as exc:
        if not empty:
            report.problem(name, f"Lance cannot read it: {exc}")
        return None
    facts.unread.remove(name)
    rewrites = interrupted_rewrites(ds)
    if rewrites:
        report.problem(
            name,
            f"the layout rewrite of column(s) {', '.join(map(key_name, rewrites))} was interrupted (a temporary "
            "column is left)",
            _rewrites_fix(uri, rewrites),
        )
    orphans = _orphans(uri, ds)
    if orphans:
        report.problem(
            name,
            f"{len(orphans)} data file(s) no version refers to (an append whose commit never came), e.g. "
            f"data/{orphans[0]}",
            _done(
                lambda: remove_orphans(lance.dataset(str(uri)), RETAIN_SECONDS, lambda: None),
                f"{name}: removed {len(orphans)} data file(s) no version referred to",
            ),
        )
    rows = table.num_rows
    index = (
        table.column(INDEX_KEY) if INDEX_KEY in table.column_names else pa.chunked_array([pa.nulls(rows, pa.int64())])
    )
    nulls = index.null_count
    values = index.fill_null(-1).to_numpy().astype(np.int64, copy=False)
    wrong = lance_order.disorder(ds)
    if wrong is not None:
        fixable = not nulls and len(np.unique(values)) == len(values)
        report.problem(
            name,
            f"{wrong}; reads address rows by position, so a bucket must stay in {INDEX_KEY!r} order"
            + ("" if fixable else ", and which row is right cannot be told"),
            _order_fix(uri) if fixable else None,
        )
    fragments = len(ds.get_fragments())
    report.summary.append(f"{name}: {rows} rows in {fragments} fragment(s), version {ds.version}")
    return BucketRows(values, table, ds.schema)


def check_buckets(facts: Facts, report: TopicReport) -> None:
    facts.buckets = [_bucket(facts, report, b) for b in range(facts.num_buckets)]
    for path in sorted(facts.folder.glob("bucket-*.lance")):
        match = _BUCKET.match(path.name)
        if match is None or int(match.group(1)) >= facts.num_buckets:
            report.problem(path.name, f"not a bucket of this topic (num_buckets={facts.num_buckets}): not read")
