"""The write-ahead log (``wal/<first index>.log``): every segment read frame by frame with the engine's own parser
(engine/wal.py: magic, crc32, header), without the truncation a replay makes.

Found: frames that fail their checksum or are cut (``BadSpan``: where the header still says which rows it held,
and whether intact frames follow), frames that overlap, a segment whose frames start before its name, frames
above ``flushed_upto`` whose rows do not decode. A damaged frame whose rows are all in Lance below
``flushed_upto`` (or cleared) is not needed by any replay: ``--repair`` takes it out of its segment and keeps
every intact frame (the next open would instead cut the segment there and drop every later segment). A damaged
frame whose rows are not in Lance cannot be read back: reported, nothing is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..engine.wal import frame_bounds, parse_frame, segment_files
from ..errors import CorruptionError
from .facts import BadSpan, Facts, LoggedFrame
from .report import TopicReport, spans
from .rewrite import replace_bytes

MAX_FRAME_ROWS = 2**32  # a header's count above this is damage


def _zeros_from(data: bytes, pos: int) -> bool:
    return data.count(0, pos) == len(data) - pos


def _intact_at(data: bytes, pos: int) -> bool:
    """Whether an intact frame, the preallocated zeros or the end of the segment come at ``pos``."""
    if pos >= len(data) or _zeros_from(data, pos):
        return True
    try:
        return parse_frame(data, pos)[0] is not None
    except CorruptionError:
        return True  # it passed its checksum: a frame starts there


def _scan(facts: Facts, path: Path, data: bytes) -> None:
    pos = 0
    while pos < len(data):
        try:
            frame, end = parse_frame(data, pos)
        except CorruptionError:
            frame, end = None, pos
        if frame is not None:
            facts.frames.append(LoggedFrame(path, pos, end, frame))
            pos = end
            continue
        if _zeros_from(data, pos):
            return  # room allocated ahead
        bounds = frame_bounds(data, pos)
        if bounds is not None and bounds[2] <= len(data) and _intact_at(data, bounds[2]):
            facts.bad.append(BadSpan(path, pos, bounds[2], bounds[0], bounds[1]))
            pos = bounds[2]
            continue
        facts.bad.append(BadSpan(path, pos, len(data), *(bounds[:2] if bounds is not None else (None, None))))
        return


def scan_log(facts: Facts, report: TopicReport) -> None:
    """Read every segment into ``facts`` (frames, damaged spans, the kinds the frames carry); reports overlaps."""
    directory = facts.folder / "wal"
    if not directory.is_dir():
        return
    segments = segment_files(directory)
    for start, path in segments:
        try:
            data = path.read_bytes()
        except OSError as exc:
            report.problem(f"wal/{path.name}", f"cannot be read: {exc}")
            continue
        first = len(facts.frames)
        _scan(facts, path, data)
        if len(facts.frames) > first and facts.frames[first].first < start:
            report.problem(f"wal/{path.name}", f"holds rows from {facts.frames[first].first}, before its name says")
    previous: LoggedFrame | None = None
    for lf in facts.frames:
        kinds = lf.part(1)
        if isinstance(kinds, dict):
            facts.logged_kinds.update({str(k): str(v) for k, v in kinds.items()})
        if previous is not None and lf.first < previous.stop:
            report.problem(
                f"wal/{lf.segment.name}",
                f"the frame of rows {lf.first}..{lf.stop - 1} overlaps the one before it (rows {previous.first}.."
                f"{previous.stop - 1}): a replay would take both",
            )
        previous = lf
    rows = sum(lf.frame.count for lf in facts.frames)
    report.summary.append(f"log: {len(segments)} segment(s), {len(facts.frames)} intact frame(s) of {rows} rows")


def _unneeded(span: BadSpan, facts: Facts, stored: np.ndarray, cleared: set[int]) -> str | None:
    """None when no replay needs the rows of a damaged frame; else why it cannot be taken out."""
    if facts.unread:
        return f"{', '.join(facts.unread)} could not be read, so whether Lance holds its rows cannot be told"
    if span.first is None or span.count is None or not 0 < span.count < MAX_FRAME_ROWS:
        return "no frame header is left there, so which rows it held cannot be told"
    stop = span.first + span.count
    before = [lf for lf in facts.frames if lf.segment == span.segment and lf.end <= span.start]
    after = [lf for lf in facts.frames if lf.segment == span.segment and lf.start == span.end]
    # The frames around it (or the segment's name) say where its rows start and end: a header that disagrees is
    # damaged too, and its rows cannot be told.
    starts = before[-1].stop if before else int(span.segment.stem)
    if span.first != starts or (after and after[0].first != stop):
        return "its header is damaged too, so which rows it held cannot be told"
    rows = np.arange(span.first, stop, dtype=np.int64)
    lost = [int(i) for i in rows[~np.isin(rows, stored)] if int(i) not in cleared]
    if stop > facts.flushed_upto or lost:
        shown = spans(lost) if lost else f"{span.first}..{stop - 1}"
        return (
            f"rows {shown} are not in Lance, so they cannot be read back (a write a power loss cut was never "
            "acknowledged; anything else lost them)"
        )
    return None


def _splice(path: Path, keep: list[tuple[int, int]], dropped: int) -> Callable[[], str]:
    def fix() -> str:
        data = path.read_bytes()
        size = replace_bytes(path, [data[a:b] for a, b in keep])
        return (
            f"wal/{path.name}: took {dropped} damaged frame(s) out ({len(data) - size} bytes), kept its "
            f"{len(keep)} intact frame(s)"
        )

    return fix


def judge_log(facts: Facts, report: TopicReport) -> None:
    """Once the buckets are read: whether each damaged frame is needed, and the frames a replay will decode."""
    stored, cleared = facts.stored(), facts.cleared()
    for segment in dict.fromkeys(span.segment for span in facts.bad):
        mine = [span for span in facts.bad if span.segment == segment]
        verdicts = [_unneeded(span, facts, stored, cleared) for span in mine]
        keep = [(lf.start, lf.end) for lf in facts.frames if lf.segment == segment]
        fix = _splice(segment, keep, len(mine)) if all(v is None for v in verdicts) else None
        cut = mine[0].start
        after = [lf for lf in facts.frames if (lf.segment, lf.start) > (segment, cut)]
        pending = [(max(lf.first, facts.flushed_upto), lf.stop) for lf in after if lf.stop > facts.flushed_upto]
        texts = []
        for span in mine:
            what = "bytes"
            if span.first is not None and span.count:
                what = f"the frame of rows {span.first}..{span.first + span.count - 1}"
            texts.append(f"{what} (bytes {span.start}..{span.end}) fails its checksum or is cut")
        text = "; ".join(texts)
        if fix is not None:
            text += f"; their rows are in Lance (below flushed_upto {facts.flushed_upto}), no replay needs them"
        else:
            text += "; " + "; ".join(v for v in verdicts if v is not None)
            text += f". The next open cuts the log at byte {cut}"
            if pending:
                text += f" and drops the unflushed rows logged after it ({pending[0][0]}..{pending[-1][1] - 1})"
        report.problem(f"wal/{segment.name}", text, fix)
    replayed = [lf for lf in facts.frames if lf.stop > facts.flushed_upto]
    if replayed:
        report.summary.append(
            f"log: {len(replayed)} frame(s) above flushed_upto {facts.flushed_upto} (rows "
            f"{replayed[0].first}..{replayed[-1].stop - 1}), replayed at the next open"
        )
    for lf in replayed:
        try:
            lf.frame.rows()
        except CorruptionError as exc:
            report.problem(f"wal/{lf.segment.name}", f"{exc}: the next open fails on it")
        ref = lf.part(3)
        if isinstance(ref, dict) and "gen" in ref:
            report.note(
                f"wal/{lf.segment.name}",
                f"rows {lf.first}..{lf.stop - 1} keep their tensors in the shared memory of the broker that took "
                "them: its next start re-adopts them if that memory is still there (else those fields read None)",
            )
