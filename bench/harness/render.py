"""A ``Report`` as text: a console table, a Markdown page (as the docs pages hold them) or JSON, the run's
metadata first; and the chart the harness draws for ``--plot`` where a suite has none of its own."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .plots import pyplot, save
from .report import Report, Table

FORMATS = ("console", "md", "json")


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return "\n".join(lines)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown (GitHub) pipe table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines.extend("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows)
    return "\n".join(lines)


def render(report: Report, meta: Mapping[str, Any], fmt: str) -> str:
    """``report`` in ``fmt`` (one of ``FORMATS``) under the run's ``meta``; empty tables are left out."""
    tables = [t for t in report.tables if t.rows]
    if fmt == "json":
        out = {"meta": dict(meta), "wall_s": report.wall_s, "tables": [t.to_json() for t in tables]}
        out |= {"notes": report.notes, "failed": report.failed}
        return json.dumps({**out, **report.data}, indent=2, default=str)
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    meta_lines = [f"{k}: {v}" for k, v in meta.items()]
    if fmt == "console":
        parts = meta_lines
        for t in tables:
            parts += ["", t.heading, plain_table(t.headers(), [t.cells(r) for r in t.rows])]
        return "\n".join([*parts, "", *report.notes])
    parts = [f"## {report.title}", "", *(f"- {line}" for line in meta_lines)]
    for t in tables:
        parts += ["", f"### {t.heading}", "", md_table(t.headers(), [t.cells(r) for r in t.rows])]
    if report.notes:
        parts += ["", "### Notes", "", *(f"- {line}" for line in report.notes)]
    return "\n".join(parts)


def default_charts(report: Report, subtitle: str, folder: Path) -> list[Path]:
    """One bar chart per measured table: the median of its first metric per row (grouped by the row's group)."""
    out = []
    for n, table in enumerate(t for t in report.tables if t.metrics and t.rows):
        out.append(_bars(pyplot(), table, subtitle, folder, f"{_slug(report.title)}_{n + 1}.png", save))
    return out


def _bars(plt: Any, table: Table, subtitle: str, folder: Path, name: str, save: Any) -> Path:
    metric = table.metrics[0]
    rows = [r for r in table.rows if r.median(metric.name) is not None]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.32 * max(len(rows), 1)))
    names = [" ".join(dict.fromkeys(x for x in (r.group, *r.labels) if x)) for r in rows]
    bars = ax.barh(range(len(rows)), [r.median(metric.name) or 0.0 for r in rows])
    ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_yticks(range(len(rows)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{metric.name} (median; {'higher' if metric.higher_is_better else 'lower'} is better)")
    ax.set_title(table.heading, fontsize=9)
    return save(fig, folder, name, subtitle)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_") or "bench"
