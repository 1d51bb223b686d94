"""Rendering a BenchResult as a plain console table, reStructuredText, or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .flush import FlushResult
from .queue_bench import BenchResult, Row
from .stores import REFERENCE, STORES

FORMATS = ("console", "rst", "json")
_REF_STORE = next(s for s in STORES if s.key == REFERENCE)

QUEUE_HEADERS = (
    "store",
    "settings",
    "N",
    "write rec/s",
    "read rec/s",
    "write s",
    "read s",
    "write+read s",
    "speed vs SQLiteQueue",
)
FLUSH_HEADERS = ("topic", "rows stored", "flushes of 1,000 rows", "median ms", "p90 ms", "vs empty (median)")


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}" if seconds > 0 else "inf"


def queue_cells(row: Row) -> list[str]:
    head = [row.store.label, row.store.key, f"{row.n:,}"]
    t = row.timing
    if t is None:
        return [*head, "-", "-", "-", "-", row.note, "-"]
    ratio = (
        "n/a" if row.ratio is None else f"~{row.ratio:.1f}x (projected)" if row.ratio_projected else f"{row.ratio:.2f}x"
    )
    return [
        *head,
        _rate(t.n, t.write_s),
        _rate(t.n, t.read_s),
        f"{t.write_s:.3f}",
        f"{t.read_s:.3f}",
        f"{t.total_s:.3f}",
        ratio,
    ]


def flush_cells(flush: FlushResult) -> list[list[str]]:
    out = []
    for series in (flush.empty, flush.full):
        ratio = series.median_s / flush.empty.median_s
        out.append(
            [
                series.label,
                f"{series.stored_rows:,}",
                str(len(series.samples_s)),
                f"{series.median_s * 1e3:.2f}",
                f"{series.p90_s * 1e3:.2f}",
                f"{ratio:.2f}x",
            ]
        )
    return out


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


def _settings_lines(result: BenchResult) -> list[str]:
    seen = []
    for row in result.rows:
        if row.store not in seen:
            seen.append(row.store)
    return [f"{s.key}: {s.label}, {s.settings}" for s in seen]


def _notes(result: BenchResult) -> list[str]:
    notes = [
        f"speed vs SQLiteQueue = write+read time of {_REF_STORE.label} ({REFERENCE}) / this store's, same N "
        "(above 1 = faster); where SQLiteQueue was skipped, its projected time is used and marked so.",
        f"Skip rule: {result.skip_rule}",
    ]
    if result.flush is not None:
        f = result.flush
        notes.append(
            f"Flush cost: {len(f.full.samples_s)} flushes per topic after one warm-up, topics alternating; "
            f"full/empty ratio median {f.median_ratio:.2f}x, p90 {f.p90_ratio:.2f}x (aim: within 2x). "
            f"Prefill of {f.full.stored_rows:,} rows took {f.prefill_s:.1f} s; reopening it {f.reopen_s:.2f} s."
        )
    notes.append(
        f"Whole run: {result.wall_s:.1f} s wall. Timings are from one run on a shared machine: compare "
        "ratios within it, not across runs."
    )
    return notes


def render(result: BenchResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_json(result), indent=2)
    meta = [f"{k}: {v}" for k, v in result.meta.items()]
    queue_rows = [queue_cells(r) for r in result.rows]
    if fmt == "console":
        parts = [*meta, "", plain_table(QUEUE_HEADERS, queue_rows)]
        if result.flush is not None:
            parts += ["", plain_table(FLUSH_HEADERS, flush_cells(result.flush))]
        parts += ["", *_settings_lines(result), "", *_notes(result)]
        return "\n".join(parts)
    if fmt != "rst":
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    parts = ["Queue benchmark", "===============", ""]
    parts += [f"- {line}" for line in meta] + ["", "Write then read", "---------------", ""]
    parts += [rst_table(QUEUE_HEADERS, queue_rows), ""]
    if result.flush is not None:
        parts += ["Flush cost vs stored data", "-------------------------", ""]
        parts += [rst_table(FLUSH_HEADERS, flush_cells(result.flush)), ""]
    parts += ["Settings", "--------", ""] + [f"- {line}" for line in _settings_lines(result)] + [""]
    parts += ["Notes", "-----", ""] + [f"- {line}" for line in _notes(result)]
    return "\n".join(parts)


def to_json(result: BenchResult) -> dict[str, Any]:
    rows = []
    for r in result.rows:
        t = r.timing
        rows.append(
            {
                "store": r.store.key,
                "label": r.store.label,
                "settings": r.store.settings,
                "n": r.n,
                "skipped": t is None and r.projected_s is not None,
                "projected_s": r.projected_s,
                "write_s": t.write_s if t else None,
                "read_s": t.read_s if t else None,
                "total_s": t.total_s if t else None,
                "write_rec_per_s": t.n / t.write_s if t and t.write_s > 0 else None,
                "read_rec_per_s": t.n / t.read_s if t and t.read_s > 0 else None,
                "speed_vs_sqlitequeue": r.ratio,
                "speed_vs_sqlitequeue_projected": r.ratio_projected,
            }
        )
    return {
        "meta": result.meta,
        "reference": REFERENCE,
        "skip_rule": result.skip_rule,
        "wall_s": result.wall_s,
        "results": rows,
        "flush": result.flush.to_json() if result.flush is not None else None,
    }
