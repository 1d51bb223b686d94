"""Row order of a bucket: how a Lance rewrite keeps it, and how a bucket that lost it gets it back.

The engine stores a bucket's rows in strictly increasing global index (``_persisting_index``): a row's position is
its address for reads (engine/buckets.py). Lance (pylance 14) commits the fragments of a ``Rewrite`` (what a
compaction produces) at the END of the fragment list, whatever their place was::

    before      [0-3] [4] [5] [6-9] [10]             a run of small fragments between bigger ones
    Lance       [0-3] [6-9] [10] [4-5]               what Compaction.commit makes of it: out of order
    commit()    [0-3] [4-5] [6-9] [10]               one Rewrite: the run merged, everything after it moved behind

Design: a compaction (``commit``) is ONE ``Rewrite`` whose group is the suffix of the fragment list from the first
fragment it merges: the merged fragments in their place and every later fragment moved behind them unchanged. A
moved fragment keeps its files, row ids and deletion vector (only the manifest lists it again), so the commit costs
a manifest write and a kill leaves the version before or the version after it, both in order.

Stores compacted by persisting before this module (0.1 up to the release that added it) can be out of order; the
open repairs them (``repair``, called by the engine when the index column it reads is not increasing, and by
``persisting-broker check --repair``). ``disorder`` classifies a bucket:

    fragments out of place   every fragment increasing and their ranges disjoint: one manifest-only Rewrite moves
                             the misplaced suffix into order (no data read or written), unless one of those
                             fragments has deleted rows (then as below: a moved fragment's id changes)
    rows interleaved         a fragment mixes rows of several places (what repeated compactions made of moved
                             fragments): the bucket is rewritten in index order in one overwrite commit (reads and
                             writes every row once, ``REWRITE_CHUNK_BYTES`` at a time)
    duplicate or null index  not something the engine writes: ``CorruptionError``, nothing is changed

Every repair is one commit: a kill during it leaves the old version (repaired again at the next open) or the new one.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import FragmentMetadata

from ..errors import CorruptionError
from ..wire.codec import INDEX_KEY

log = logging.getLogger(__name__)

REWRITE_CHUNK_BYTES = 64 * 1024 * 1024  # rows taken per step of an interleaved bucket's rewrite


def fragment_indexes(ds: lance.LanceDataset) -> list[tuple[Any, np.ndarray]]:
    """Each fragment with its index values (deleted rows left out), in fragment order."""
    out = []
    for fragment in ds.get_fragments():
        column = fragment.to_table(columns=[INDEX_KEY]).column(0)
        if column.null_count:
            raise CorruptionError(f"{ds.uri}: fragment {fragment.fragment_id} holds rows without {INDEX_KEY!r}")
        out.append((fragment, column.to_numpy().astype(np.int64, copy=False)))
    return out


def _increasing(values: np.ndarray) -> bool:
    return bool(np.all(values[1:] > values[:-1]))


def disorder(ds: lance.LanceDataset) -> str | None:
    """None when the index column strictly increases in position order; else one line saying what is wrong."""
    if INDEX_KEY not in ds.schema.names:
        return None if ds.count_rows() == 0 else f"no {INDEX_KEY!r} column"
    try:
        parts = fragment_indexes(ds)
    except CorruptionError as exc:
        return str(exc)
    values = np.concatenate([v for _, v in parts]) if parts else np.zeros(0, np.int64)
    if _increasing(values):
        return None
    if len(np.unique(values)) != len(values):
        return f"{len(values) - len(np.unique(values))} duplicate {INDEX_KEY!r} values"
    if _fragments_disjoint(parts):
        out = len(parts) - _kept_prefix(parts)
        return f"{out} of {len(parts)} fragments out of index order (a compaction moved them)"
    return f"rows of {len(parts)} fragments interleaved out of index order (repeated compactions)"


def _fragments_disjoint(parts: Sequence[tuple[Any, np.ndarray]]) -> bool:
    spans = sorted((int(v[0]), int(v[-1])) for _, v in parts if len(v))
    inside = all(_increasing(v) for _, v in parts)
    return inside and all(a[1] < b[0] for a, b in itertools.pairwise(spans))


def _sorted_fragments(parts: Sequence[tuple[Any, np.ndarray]]) -> list[Any]:
    """Fragments in index order; empty ones (every row deleted) keep their place relative to the one before."""
    keyed, last = [], -1
    for n, (fragment, values) in enumerate(parts):
        key = int(values[0]) if len(values) else last
        keyed.append((key, len(values) == 0, n, fragment))
        last = int(values[-1]) if len(values) else last
    return [f for *_, f in sorted(keyed, key=lambda k: (k[0], not k[1], k[2]))]


def _kept_prefix(parts: Sequence[tuple[Any, np.ndarray]]) -> int:
    desired = _sorted_fragments(parts)
    k = 0
    while k < len(parts) and parts[k][0].fragment_id == desired[k].fragment_id:
        k += 1
    return k


def moved(metadata: FragmentMetadata) -> FragmentMetadata:
    """A fragment as a Rewrite's new fragment that is the old one unchanged (same files and row ids): a
    manifest-only move. Id 0: Lance gives a Rewrite's new fragments fresh ids, in the order given (fragments lie
    in id order), so a fragment with a deletion file must not be moved: Lance finds that file by the fragment's
    id. The compaction rewrites every fragment with deleted rows; the repair rewrites the rows instead."""
    return FragmentMetadata(
        id=0,
        files=metadata.files,
        physical_rows=metadata.physical_rows,
        deletion_file=metadata.deletion_file,
        row_id_meta=metadata.row_id_meta,
        created_at_version_meta=metadata.created_at_version_meta,
        last_updated_at_version_meta=metadata.last_updated_at_version_meta,
        overlays=metadata.overlays,
    )


def rewrite(ds: lance.LanceDataset, old: list[FragmentMetadata], new: list[FragmentMetadata]) -> lance.LanceDataset:
    group = lance.LanceOperation.RewriteGroup(old_fragments=old, new_fragments=new)
    operation = lance.LanceOperation.Rewrite(groups=[group], rewritten_indices=[])
    return lance.LanceDataset.commit(ds, operation, read_version=ds.version)


def repair(ds: lance.LanceDataset) -> tuple[lance.LanceDataset, str]:
    """Put the rows of ``ds`` back in index order in one commit; returns the new dataset and what was done.
    ``CorruptionError`` where the order cannot be told (duplicate or missing indexes); ``ds`` is then unchanged."""
    problem = disorder(ds)
    if problem is None:
        return ds, "in order"
    parts = fragment_indexes(ds)
    values = np.concatenate([v for _, v in parts])
    if len(np.unique(values)) != len(values):
        raise CorruptionError(f"{ds.uri}: {problem}; not repaired (which copy is right cannot be told)")
    k = _kept_prefix(parts)
    if _fragments_disjoint(parts) and not any(f.metadata.deletion_file for f, _ in parts[k:]):
        desired = _sorted_fragments(parts)
        old = [f.metadata for f, _ in parts[k:]]
        new = [moved(f.metadata) for f in desired[k:]]
        return rewrite(ds, old, new), f"moved {len(new)} of {len(parts)} fragments back into index order"
    order = np.argsort(values, kind="stable")
    fresh = lance.write_dataset(
        _in_order(ds, order),
        ds.uri,
        schema=ds.schema,
        mode="overwrite",
        data_storage_version=ds.data_storage_version,  # type: ignore[arg-type]  # a version Lance wrote
        enable_stable_row_ids=True,
    )
    return fresh, f"rewrote its {len(values)} rows in index order (they were interleaved across fragments)"


def _in_order(ds: lance.LanceDataset, order: np.ndarray) -> pa.RecordBatchReader:
    """The rows of ``ds`` at positions ``order``, as a stream of tables of about ``REWRITE_CHUNK_BYTES``."""
    total = max(1, ds.count_rows())
    size = sum(f.file_size_bytes or 0 for fragment in ds.get_fragments() for f in fragment.data_files())
    step = max(1, int(REWRITE_CHUNK_BYTES * total // max(1, size)))

    def batches() -> Iterator[pa.RecordBatch]:
        for k in range(0, len(order), step):
            yield from ds.take(order[k : k + step]).to_batches()

    return pa.RecordBatchReader.from_batches(ds.schema, batches())


def commit(latest: lance.LanceDataset, rewrites: list[Any]) -> list[Any]:
    """Commit a compaction's ``rewrites`` (``RewriteResult`` of tasks made from ``latest``'s version) as one Rewrite
    that keeps the order (module docstring). Returns the rewrites left out, whose fragments are not a contiguous run
    of ``latest`` (Lance plans runs; the caller deletes their files)."""
    current = [f.metadata for f in latest.get_fragments()]
    where = {m.id: n for n, m in enumerate(current)}
    starts: dict[int, tuple[int, list[FragmentMetadata]]] = {}  # first position of a run -> (its length, new)
    left = []
    for result in rewrites:
        at = sorted(where.get(m.id, -1) for m in result.original_fragments)
        if not at or at[0] < 0 or at != list(range(at[0], at[0] + len(at))):
            left.append(result)
            continue
        starts[at[0]] = (len(at), list(result.new_fragments))
    first = min(starts, default=len(current))
    kept = set(range(first, len(current))) - {n + k for n, (length, _) in starts.items() for k in range(length)}
    if any(current[n].deletion_file for n in kept):  # a moved fragment would lose its deletions (``moved``)
        return rewrites
    if not starts:
        return left
    new: list[FragmentMetadata] = []
    n = first
    while n < len(current):
        if n in starts:
            length, made = starts[n]
            new.extend(made)
            n += length
        else:
            new.append(moved(current[n]))
            n += 1
    rewrite(latest, current[first:], new)
    return left
