"""The consumption log (``consumption.log``): its frames read and applied with the engine's own replay
(engine/consumption.py ``replay_frames``), without the cut and compaction an open makes.

A record that is cut at the end (a write a crash interrupted) or fails its checksum is reported; when intact
records follow a damaged one, the open would cut them off too (takes handed out again, clears and tags undone).
``--repair`` rewrites the log without the damaged bytes and keeps every intact record, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..engine.consumption import Replayed, frame_end, replay_frames
from .facts import Facts
from .report import TopicReport
from .rewrite import replace_bytes

FILE = "consumption.log"


def _splice(path: Path, keep: list[tuple[int, int]], lost: str) -> Callable[[], str]:
    def fix() -> str:
        data = path.read_bytes()
        size = replace_bytes(path, [data[a:b] for a, b in keep])
        return f"{FILE}: removed {len(data) - size} damaged bytes, kept every intact record{lost}"

    return fix


def check_consumption(facts: Facts, report: TopicReport) -> None:
    path = facts.folder / FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        report.summary.append("consumption log: none (nothing taken, cleared or tagged yet)")
        return
    except OSError as exc:
        report.problem(FILE, f"cannot be read: {exc}")
        return
    state = facts.log
    good: list[tuple[int, int]] = []
    bad: list[tuple[int, int]] = []
    pos = 0
    while True:
        stop = replay_frames(data, state, pos)
        if stop > pos:
            good.append((pos, stop))
        if stop >= len(data):
            break
        end = frame_end(data, stop)
        if end < len(data) and replay_frames(data, Replayed(), end) > end:
            bad.append((stop, end))  # a damaged record between intact ones
            pos = end
            continue
        bad.append((stop, len(data)))
        break
    if len(bad) == 1 and bad[0][1] == len(data):
        report.problem(
            FILE,
            f"the record at byte {bad[0][0]} of {len(data)} is cut or fails its checksum (a write a crash "
            "interrupted); the next open cuts it off too",
            _splice(path, good, ""),
        )
    elif bad:
        where = ", ".join(f"{a}..{b}" for a, b in bad)
        report.problem(
            FILE,
            f"the records at bytes {where} fail their checksum and intact records follow: the next open would cut "
            "the log at the first and lose the rest (takes handed out again, clears and tags undone)",
            _splice(path, good, "; a take in a damaged record is handed out again, a clear or tags in it are lost"),
        )
    tasks = len(state.taken)
    cleared = sum(len(v) for v in state.cleared.values())
    tagged = sum(len(v) for v in state.tags.values())
    report.summary.append(
        f"consumption log: {len(data)} bytes, {tasks} task(s) with takes, {cleared} cleared sample(s), {tagged} tagged"
    )
