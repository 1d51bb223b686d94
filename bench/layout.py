"""The text every benchmark report prints: console and reStructuredText tables, the page they stand on (title,
meta, sections), the closing notes all reports share, and the JSON envelope (each report names its fields)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FORMATS = ("console", "rst", "md", "json")
AIM_HEADERS = ("aim", "measured", "target", "met")


@dataclass(frozen=True, slots=True)
class Section:
    """A table (``headers`` and ``rows``) or, without headers, ``lines``: bullets in rst, plain lines on the console
    (``console`` where the console wants other words)."""

    heading: str
    headers: Sequence[str] = ()
    rows: Sequence[Sequence[str]] = ()
    lines: Sequence[str] = ()
    console: Sequence[str] | None = None


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return "\n".join(lines)


def rst_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A reStructuredText grid table (cells may be empty, which simple tables do not allow in column 1)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    head_sep = sep.replace("-", "=")

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [sep, line(headers), head_sep]
    for r in rows:
        out += [line(r), sep]
    return "\n".join(out)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown (GitHub) pipe table, as the documentation pages hold them."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines.extend("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows)
    return "\n".join(lines)


def page(fmt: str, title: str, meta: Mapping[str, Any], sections: Iterable[Section | None]) -> str:
    """The report in ``fmt`` "console", "rst" or "md"; a ``None`` section (nothing measured) is left out."""
    present = [s for s in sections if s is not None]
    meta_lines = [f"{k}: {v}" for k, v in meta.items()]
    if fmt == "console":
        parts = meta_lines
        for s in present:
            if s.headers:
                parts += ["", plain_table(s.headers, s.rows)]
            else:
                parts += ["", *(s.lines if s.console is None else s.console)]
        return "\n".join(parts)
    if fmt not in ("rst", "md"):
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    md = fmt == "md"
    table = md_table if md else rst_table
    parts = [f"## {title}"] if md else [title, "=" * len(title)]
    parts += ["", *(f"- {line}" for line in meta_lines)]
    for s in present:
        parts += ["", f"### {s.heading}"] if md else ["", s.heading, "-" * len(s.heading)]
        parts += ["", table(s.headers, s.rows)] if s.headers else ["", *(f"- {line}" for line in s.lines)]
    return "\n".join(parts)


def closing_notes(
    wall_s: float, broker_log: Sequence[str] = (), what: str = "broker log lines at WARNING or above"
) -> list[str]:
    """The notes every report ends with: how many broker log lines are worth a look and the first ten of them
    (none: nothing said), then the run's wall time and how to read its numbers."""
    notes = [f"{what}: {len(broker_log)}", *(f"  {line}" for line in broker_log[:10])] if broker_log else []
    notes.append(
        f"Whole run: {wall_s:.1f} s wall. Timings are from one run on a shared machine: compare ratios within it, "
        "not across runs."
    )
    return notes


def report_json(result: Any, **fields: Any) -> str:
    """A report as JSON: the result's meta, settings and wall time, then ``fields`` in order."""
    return json.dumps({"meta": result.meta, "settings": result.settings, "wall_s": result.wall_s, **fields}, indent=2)


def aims_json(rows: Sequence[Sequence[str]]) -> list[dict[str, str]]:
    return [dict(zip(AIM_HEADERS, row, strict=True)) for row in rows]
