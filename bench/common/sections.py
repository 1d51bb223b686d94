"""Reports built as sections of pre-formatted cells (``Section``) beside harness tables, turned into the harness's
``Report``: the form the broker, arena and samples suites had before the harness. Their latency tables are
harness tables (the harness takes the percentiles and the ratios); the rest are aims, workload counters and
per-case rows whose figures their reports compute."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import Report, Row, Table

AIM_HEADERS = ("aim", "measured", "target", "met")


@dataclass(frozen=True, slots=True)
class Section:
    """A table (``headers`` and ``rows``) or, without headers, ``lines`` (they go to the report's notes)."""

    heading: str
    headers: Sequence[str] = ()
    rows: Sequence[Sequence[str]] = ()
    lines: Sequence[str] = ()


@dataclass(slots=True)
class Sections:
    """What ``as_report`` needs besides the sections."""

    meta: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    charts: Callable[[Path, str], list[Path]] | None = None
    wall_s: float = 0.0


def as_report(title: str, sections: Iterable[Section | Table | None], more: Sections) -> Report:
    """The harness's report of ``sections`` in order (a ``Table``: as it is; a ``None`` section: nothing measured,
    left out)."""
    tables, notes = [], []
    for s in sections:
        if s is None:
            continue
        if isinstance(s, Table):
            tables.append(s)
        elif s.headers:
            tables.append(Table(s.heading, tuple(s.headers), rows=[Row(tuple(r)) for r in s.rows]))
        elif s.heading == "Notes":
            notes += list(s.lines)
        else:
            notes += [f"{s.heading}: {line}" for line in s.lines]
    return Report(title, tables, notes, more.meta, more.data, more.charts, more.wall_s)


def closing_notes(broker_log: Sequence[str] = (), what: str = "broker log lines at WARNING or above") -> list[str]:
    """How many broker log lines are worth a look and the first ten of them (none: nothing said). The harness
    adds the run's wall time and how to read its numbers."""
    return [f"{what}: {len(broker_log)}", *(f"  {line}" for line in broker_log[:10])] if broker_log else []


def aims_json(rows: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    return [dict(zip(AIM_HEADERS, row, strict=True)) for row in rows]
