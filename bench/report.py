"""The ``queue`` benchmark's report: a BenchResult as a console table, reStructuredText, or JSON."""

from __future__ import annotations

import json
from typing import Any

from .flush import FlushResult
from .layout import Section, closing_notes, page
from .queue_bench import BenchResult, Row
from .stores import REFERENCE, STORES

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
    return notes + closing_notes(result.wall_s)


def render(result: BenchResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_json(result), indent=2)
    flush = result.flush
    sections = [
        Section("Write then read", QUEUE_HEADERS, [queue_cells(r) for r in result.rows]),
        None if flush is None else Section("Flush cost vs stored data", FLUSH_HEADERS, flush_cells(flush)),
        Section("Settings", lines=_settings_lines(result)),
        Section("Notes", lines=_notes(result)),
    ]
    return page(fmt, "Queue benchmark", result.meta, sections)


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
