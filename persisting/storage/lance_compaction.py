"""Compaction of a bucket's small fragments, off the flush's line: the rewrite (the slow part: reading and writing
every row of the small fragments) runs while appends go on, and only its commit, a manifest write, waits for them.

Row order: Lance (pylance 14) places the fragments a rewrite produced at the END of the fragment list, which
reorders a bucket whenever the merged run is not its tail (small fragments between big ones: mixed batch sizes, a
replay, a flush forced by memory pressure). The commit is lance_order's: one Rewrite that puts the merged fragments
in their place and moves every later fragment behind them, unchanged.

Why the commit is refused after an append: the rewrite was planned on the version it read; an append that landed
since must not be moved or merged blindly. A refused rewrite's files are deleted at once (local disk) or left,
unreferenced, to the cleanup at the next open (object store); the caller retries at its next maintenance, and after
``MAX_COMPACTION_DEFERRALS`` refusals in a row compacts holding the append lock (an uninterrupted stream of flushes
must not grow the fragment count forever).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import lance
from lance.optimize import Compaction

from . import lance_order

log = logging.getLogger(__name__)

MAX_COMPACTION_DEFERRALS = 3
# A fragment this big is never rewritten, however few rows it has: reading it costs far more than opening it, and
# a tensor stream must not write its payload twice (fragments of a flush of arena batches are at least this big
# wherever it goes through several encoders: lance_parallel.MIN_ENCODER_BYTES).
COMPACT_BELOW_BYTES = 16 * 1024 * 1024


def _bytes(fragment: Any) -> int:
    return sum(f.file_size_bytes or 0 for f in fragment.data_files())


def small_fragments(ds: lance.LanceDataset, target_rows_per_fragment: int) -> int:
    """How many fragments of ``ds`` a compaction would merge: fewer rows than the target and under
    ``COMPACT_BELOW_BYTES``."""
    return sum(
        1 for f in ds.get_fragments() if f.count_rows() < target_rows_per_fragment and _bytes(f) < COMPACT_BELOW_BYTES
    )


def rewrite(ds: lance.LanceDataset, target_rows_per_fragment: int) -> list[Any]:
    """The small fragments of ``ds`` rewritten into bigger ones, not committed (``RewriteResult`` per task).

    Lance picks the fragments with fewer rows than its target: that target is lowered to the rows that fill
    ``COMPACT_BELOW_BYTES`` (at the mean row size of the small fragments), so big fragments of big rows are left.
    """
    small = [f for f in ds.get_fragments() if _bytes(f) < COMPACT_BELOW_BYTES]
    rows, size = sum(f.count_rows() for f in small), sum(_bytes(f) for f in small)
    target = target_rows_per_fragment
    if rows and size:
        target = max(2, min(target, COMPACT_BELOW_BYTES * rows // size))
    # Every fragment with deleted rows is rewritten (its deletions materialized): the commit may move the
    # fragments behind a merged run, and a moved fragment gets a new id, under which Lance would not find its
    # deletion file (named by the fragment's id).
    plan = Compaction.plan(ds, {"target_rows_per_fragment": target, "materialize_deletions_threshold": 0.0})
    return [task.execute(ds) for task in plan.tasks]


def commit(latest: lance.LanceDataset, read_version: int, rewrites: list[Any], local: Path | None) -> bool:
    """Commit ``rewrites`` (made from ``read_version``) if ``latest`` is still that version, keeping the row order
    (lance_order.commit); else return False. The files of rewrites not committed are deleted (``local``: the
    dataset's folder; None on an object store, where the cleanup at the next open removes them)."""
    landed = latest.version == read_version
    left = rewrites
    if landed:
        left = lance_order.commit(latest, rewrites)
        if left:
            log.warning("%s: %d compaction tasks merged fragments that are not adjacent", latest.uri, len(left))
    if local is not None:
        for result in left:
            for fragment in result.new_fragments:
                for data_file in fragment.data_files():
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(local / "data" / data_file.path)
    return landed
