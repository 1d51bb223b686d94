"""Files of a topic's folder that are not its data: spool files (engine/spooled.py), temporary files an
interrupted write left, and anything persisting does not write.

A spool file holds the tensors of a batch larger than the arena until its rows are in Lance: one that a frame
above ``flushed_upto`` names is needed (and must hold what the frame says), one that no such frame names is a
leftover (the next open deletes it: ``spooled.sweep``), and a part file whose writer is gone was never
acknowledged. ``--repair`` deletes leftovers and temporary files; files persisting does not write are only
named.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..engine.spooled import PART_SUFFIX, SPOOL_DIRNAME, SPOOL_SUFFIX, alive, check_fields
from ..errors import ProtocolError
from .facts import Facts
from .report import TopicReport
from .rewrite import TMP_SUFFIX

DATA_FILES = {"LOCK", "topic.json", "schema.json", "state.json", "consumption.log", "wal", SPOOL_DIRNAME}
# Files the engine writes under another name and renames over the real one: left by a kill before the rename.
TEMPORARY = {"topic.json.tmp", "schema.json.tmp", "state.json.tmp", "consumption.tmp"}
_BUCKET = re.compile(r"^bucket-\d+\.lance$")
_PART = re.compile(r"^(\d+)-[0-9a-f]{32}$")


def _unlink(path: Path, line: str) -> Callable[[], str]:
    def fix() -> str:
        path.unlink(missing_ok=True)
        return line

    return fix

    return True


def _spool(facts: Facts, report: TopicReport) -> None:
    directory = facts.folder / SPOOL_DIRNAME
    stored = facts.stored()
    needed: dict[str, tuple[int, int, object]] = {}  # spool file -> (first, count, fields) of its frame
    for lf in facts.frames:
        ref = lf.part(3)
        if lf.stop > facts.flushed_upto and isinstance(ref, dict) and "spool" in ref:
            needed[str(ref["spool"])] = (lf.first, lf.frame.count, ref.get("fields"))
    for name, (first, count, fields) in needed.items():
        rows = np.arange(first, first + count, dtype=np.int64)
        if (directory / name).is_file():
            try:
                check_fields(fields, count, (directory / name).stat().st_size)
            except ProtocolError as exc:
                report.problem(f"{SPOOL_DIRNAME}/{name}", f"does not hold what its log frame says: {exc}")
        elif not facts.unread and not bool(np.all(np.isin(rows, stored))):
            report.problem(
                f"{SPOOL_DIRNAME}/{name}",
                f"is gone, and the log frame of rows {first}..{first + count - 1} needs it (they are not in Lance): "
                "their tensor fields cannot be read back and read None after the next open",
            )
    if not directory.is_dir():
        return
    for path in sorted(directory.iterdir()):
        where = f"{SPOOL_DIRNAME}/{path.name}"
        match = _PART.match(path.stem)
        if path.suffix == PART_SUFFIX and match:
            pid = int(match.group(1))
            if alive(pid):
                report.note(where, f"a batch process {pid} is writing (or a process that took its pid)")
            else:
                report.problem(
                    where,
                    f"a part file whose writer (process {pid}) is gone: its batch was never acknowledged",
                    _unlink(path, f"{where}: removed (a batch never acknowledged)"),
                )
        elif path.suffix == SPOOL_SUFFIX and match and path.name not in needed:
            report.problem(
                where,
                "no unflushed log frame needs it (its rows are in Lance): left by a kill before its deletion",
                _unlink(path, f"{where}: removed (its rows are in Lance)"),
            )
        elif path.name not in needed:
            report.note(where, "not a file persisting writes: left alone")


def check_files(facts: Facts, report: TopicReport) -> None:
    for path in sorted(facts.folder.iterdir()):
        name = path.name
        if name in DATA_FILES or _BUCKET.match(name):
            continue
        if name in TEMPORARY or name.endswith(TMP_SUFFIX):
            report.problem(
                name,
                "a temporary file an interrupted write left (the file it was to replace is intact)",
                _unlink(path, f"{name}: removed (an interrupted write's temporary file)"),
            )
        else:
            report.note(name, "not a file persisting writes: left alone")
    wal = facts.folder / "wal"
    segments = {lf.segment for lf in facts.frames} | {span.segment for span in facts.bad}
    if wal.is_dir():
        for path in sorted(wal.iterdir()):
            if path in segments or (path.suffix == ".log" and path.stem.isdigit()):
                continue
            where = f"wal/{path.name}"
            if path.name.endswith(TMP_SUFFIX):
                report.problem(where, "a repair's temporary file", _unlink(path, f"{where}: removed"))
            else:
                report.note(where, "not a file persisting writes: left alone")
    _spool(facts, report)
