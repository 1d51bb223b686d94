"""The rows across a topic's files: every index below the topic's last one is somewhere or explained, no index
is stored twice, what the consumption log names exists, and keys and patches name what they should.

Where an index may be missing (what the engine considers legitimate): a cleared sample (the consumption log's
clears: its row is purged, or never flushed), a row still only in the log (at or above ``flushed_upto``, or a
flush whose ``state.json`` came later), and a patch row (``put`` with ``batch_meta``, ``kv_put`` of an existing
key) whose sample was cleared: purged with it, or never flushed (engine/flushing.py skips chunks whose every
target is cleared). Once the log segment of such a patch is gone nothing on disk names it, so a gap below
``flushed_upto`` in a topic that has cleared samples is a note, not a problem. Nothing here is repairable: each
finding means acknowledged data is missing or doubled, and says which.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..engine.keys import KEY_COLUMN
from ..errors import CorruptionError
from ..wire.codec import OF_KEY, PARTITION_KEY
from .facts import Facts, LoggedFrame
from .report import TopicReport, spans


def _missing(present: np.ndarray, stop: int, cleared: set[int]) -> list[int]:
    """Indexes in ``[0, stop)`` neither in ``present`` (sorted, unique) nor cleared."""
    p = present[(present >= 0) & (present < stop)]
    bounds = np.concatenate(([-1], p, [stop])).astype(np.int64)
    out: list[int] = []
    for k in np.nonzero(np.diff(bounds) > 1)[0]:
        out.extend(i for i in range(int(bounds[k]) + 1, int(bounds[k + 1])) if i not in cleared)
    return out


def _frame_of(frames: list[LoggedFrame], starts: list[int], index: int) -> LoggedFrame | None:
    k = bisect.bisect_right(starts, index) - 1
    return frames[k] if k >= 0 and frames[k].first <= index < frames[k].stop else None


def _gaps(facts: Facts, report: TopicReport, present: np.ndarray, cleared: set[int]) -> None:
    frames = sorted(facts.frames, key=lambda lf: lf.first)
    starts = [lf.first for lf in frames]
    lost: list[int] = []  # in the log below flushed_upto, in no bucket
    unexplained: list[int] = []  # nowhere
    for index in _missing(present, facts.next_index(), cleared):
        lf = _frame_of(frames, starts, index)
        if lf is None:
            unexplained.append(index)
            continue
        patch = lf.part(4)
        if isinstance(patch, list) and patch and int(patch[0][index - lf.first]) in cleared:
            continue  # a patch row of a cleared sample: dropped with it
        if index < facts.flushed_upto:
            lost.append(index)
    if lost:
        report.problem(
            "",
            f"rows {spans(lost)} are in the log and below flushed_upto {facts.flushed_upto} but in no bucket: a "
            "replay skips them, so they are not served",
        )
    below = [i for i in unexplained if i < facts.flushed_upto]
    above = [i for i in unexplained if i >= facts.flushed_upto]
    if below and cleared:
        report.note(
            "",
            f"indexes {spans(below)} are in no bucket, not in the log and not cleared: patch rows of cleared "
            "samples (dropped with them) leave such gaps",
        )
    elif below:
        report.problem(
            "",
            f"indexes {spans(below)} are below flushed_upto {facts.flushed_upto} but in no bucket, not in the log "
            "and not cleared: their rows are lost (or a put failed there before it was logged)",
        )
    if above:
        report.problem(
            "",
            f"indexes {spans(above)} are at or above flushed_upto {facts.flushed_upto} but neither in a bucket nor "
            "in the log nor cleared: their rows are lost (or a put failed there before it was logged)",
        )


def _partitions(facts: Facts, wanted: set[int]) -> dict[int, Any]:
    """The partition of each of ``wanted`` that a bucket holds."""
    found: dict[int, Any] = {}
    if wanted:
        array = np.fromiter(wanted, dtype=np.int64, count=len(wanted))
        for rows in facts.buckets:
            if rows is not None:
                found.update(rows.partitions_at(array))
    return found


def _consumption(facts: Facts, report: TopicReport) -> None:
    """Clears and takes name indexes the topic has; a cleared row still stored is in the clear's partition."""
    top = facts.next_index()
    beyond = sorted(i for indexes in facts.log.cleared.values() for i in indexes if i >= top)
    for runs in facts.log.taken.values():
        intervals = runs.intervals()
        if intervals and intervals[-1][1] > top:
            beyond.extend(i for lo, hi in intervals for i in range(max(lo, top), hi))
    if beyond:
        report.problem(
            "consumption.log",
            f"takes or clears name indexes {spans(beyond)}, above the last one stored ({top - 1}): the next "
            "samples put would be born taken or cleared",
        )
    stored = _partitions(facts, facts.cleared())
    wrong = [
        i for partition, indexes in facts.log.cleared.items() for i in indexes if stored.get(i, partition) != partition
    ]
    if wrong:
        report.problem("consumption.log", f"clears samples {spans(wrong)} under a partition they are not in")


def _keys_and_patches(facts: Facts, report: TopicReport, cleared: set[int]) -> None:
    keyed: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    patches: list[tuple[int, Any, int]] = []  # (patch row, its partition, the sample it writes)
    logged: dict[int, Any] = {}  # rows only in the log: their partition
    for rows in facts.buckets:
        if rows is None:
            continue
        of, key = rows.column(OF_KEY), rows.column(KEY_COLUMN)
        parts = rows.column(PARTITION_KEY)
        for k in np.nonzero(of.is_valid().to_numpy(zero_copy_only=False))[0].tolist():
            patches.append((int(rows.indexes[k]), parts[k].as_py(), int(of[k].as_py())))
        named = pc.and_(key.is_valid(), of.is_null()).to_numpy(zero_copy_only=False)
        for k in np.nonzero(named)[0].tolist():
            if int(rows.indexes[k]) not in cleared:
                keyed[(parts[k].as_py(), key[k].as_py())].append(int(rows.indexes[k]))
    stored = facts.stored()
    for lf in facts.frames:  # rows a replay puts back, less those a flush stored already
        if lf.stop <= facts.flushed_upto:
            continue
        part, patch = lf.part(0), lf.part(4)
        try:
            frame_rows = lf.frame.rows()
        except CorruptionError:
            continue  # (reported with the log)
        inside = np.isin(np.arange(lf.first, lf.stop, dtype=np.int64), stored)
        for k, row in enumerate(frame_rows):
            i = lf.first + k
            if inside[k]:
                continue
            logged[i] = part
            if isinstance(patch, list) and patch:
                patches.append((i, part, int(patch[0][k])))
            elif isinstance(row.get(KEY_COLUMN), str) and i not in cleared:
                keyed[(part, row[KEY_COLUMN])].append(i)
    for (part, key), samples in keyed.items():
        if len(samples) > 1:
            report.problem(
                "",
                f"key {key!r} of partition {part!r} names {len(samples)} live samples ({spans(samples)}); the "
                "engine keeps one sample per key and serves the oldest",
            )
    targets = {target for _row, _part, target in patches if target not in cleared}
    partition_of = {**_partitions(facts, targets), **{i: p for i, p in logged.items() if i in targets}}
    orphans = [row for row, _part, target in patches if target in targets and target not in partition_of]
    strays = [row for row, part, target in patches if partition_of.get(target, part) != part]
    if orphans:
        report.problem("", f"patch rows {spans(orphans)} write fields of samples that are stored nowhere")
    if strays:
        report.problem("", f"patch rows {spans(strays)} write fields of samples of another partition")


def check_rows(facts: Facts, report: TopicReport) -> None:
    if facts.unread:
        report.note("", f"rows across the buckets not checked: {', '.join(facts.unread)} could not be read")
        return
    per_bucket = [np.unique(b.indexes) for b in facts.buckets if b is not None]
    both = np.sort(np.concatenate(per_bucket)) if per_bucket else np.zeros(0, np.int64)
    twice = both[1:][both[1:] == both[:-1]]
    if len(twice):
        report.problem("", f"indexes {spans(twice.tolist())} are stored in two buckets")
    cleared = facts.cleared()
    present = np.unique(both)
    _gaps(facts, report, present, cleared)
    _consumption(facts, report)
    _keys_and_patches(facts, report, cleared)
    report.summary.append(
        f"rows: {len(present)} in Lance, flushed_upto {facts.flushed_upto}, next index {facts.next_index()}, "
        f"{len(cleared)} cleared"
    )
