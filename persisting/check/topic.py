"""One topic checked, and repaired: the checks in the order each needs what the one before learned, under the
topic's lock (locks.py)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PersistingError
from .buckets import check_buckets
from .columns import check_columns
from .consumption_log import check_consumption
from .facts import Facts
from .files import check_files
from .locks import hold
from .log_frames import judge_log, scan_log
from .report import TopicReport
from .rows import check_rows
from .settings import check_settings

REPAIR_ROUNDS = 4  # a repair can reveal what it hid (an unreadable bucket's order): check and repair again


def _check(folder: Path) -> TopicReport:
    facts = Facts(folder, folder.name)
    report = TopicReport(folder.name, folder)
    if not check_settings(facts, report):
        return report
    check_consumption(facts, report)
    scan_log(facts, report)
    if facts.lance:
        check_buckets(facts, report)
    judge_log(facts, report)
    if facts.lance:
        check_columns(facts, report)
        check_rows(facts, report)
    check_files(facts, report)
    return report


def _repair(folder: Path) -> TopicReport:
    done: list[str] = []
    failed: list[str] = []
    report = _check(folder)
    for _ in range(REPAIR_ROUNDS):
        fixes = [f for f in report.problems if f.fix is not None]
        if not fixes or failed:
            break
        for finding in fixes:
            try:
                done.append(finding.fix())  # type: ignore[misc]
            except (PersistingError, OSError, ValueError, RuntimeError) as exc:
                failed.append(f"{finding.file}: the repair failed: {exc}")
        report = _check(folder)
    report.done, report.failed = done, failed
    return report


def check_topic(folder: Path, repair: bool = False) -> TopicReport:
    """Check the topic in ``folder`` (``repair``: and fix what can be fixed without losing an acknowledged row),
    holding its lock; ``TopicLockedError`` naming the process that has it open."""
    fd = hold(folder / "LOCK")
    try:
        return _repair(folder) if repair else _check(folder)
    finally:
        if fd is not None:
            os.close(fd)
