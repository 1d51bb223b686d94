"""The ``queue`` suite's report: write then read per store and N against persist-queue's SQLiteQueue (the
reference), the flush cost against stored data, the stores' settings, and the charts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common.flush import FlushResult
from bench.harness import Metric, Report, Row, Table
from bench.harness.plots import pyplot, save

from .stores import REFERENCE, STORES
from .workload import BenchResult

_REF_STORE = next(s for s in STORES if s.key == REFERENCE)
TOTAL = Metric("write+read s", higher_is_better=False, digits=4)
WRITE, READ = Metric("write rec/s"), Metric("read rec/s")
WRITE_S = Metric("write s", higher_is_better=False, digits=4)
READ_S = Metric("read s", higher_is_better=False, digits=4)
FLUSH = Metric("flush ms", higher_is_better=False)


def queue_table(result: BenchResult) -> Table:
    """One row per store and N; the ratio is the speed against SQLiteQueue at the same N (its write+read time over
    this store's). Where SQLiteQueue was skipped its projected time stands in its row, and its note says so."""
    table = Table("Write then read", ("store", "settings", "N"), (TOTAL, WRITE, READ, WRITE_S, READ_S), (REFERENCE,))
    table.extra = ("note",)
    for r in result.rows:
        group = f"{r.n:,}"
        row = table.add(r.store.label, r.store.key, group, group=group, key=r.store.key)
        if r.timings:
            row.samples = {
                TOTAL.name: [t.total_s for t in r.timings],
                WRITE.name: [t.n / t.write_s for t in r.timings if t.write_s > 0],
                READ.name: [t.n / t.read_s for t in r.timings if t.read_s > 0],
                WRITE_S.name: [t.write_s for t in r.timings],
                READ_S.name: [t.read_s for t in r.timings],
            }
        elif r.projected_s is not None:
            row.cells["note"] = f"skipped (projected {r.projected_s:.0f} s)"
            if r.store.key == REFERENCE:  # the others' ratio is then against the projection
                row.samples = {TOTAL.name: [r.projected_s]}
                row.cells["note"] += ": the ratios at this N are against its projection"
    return table


def flush_table(flush: FlushResult) -> Table:
    """A flush of 1,000 rows into a topic holding rows, against one into an empty topic (a cost: above 1 costs
    more)."""
    table = Table(
        "Flush cost vs stored data",
        ("topic", "rows stored", "flushes of 1,000 rows"),
        (FLUSH,),
        ("empty",),
        ("p90 ms",),
        plain_ratio=True,
    )
    for key, series in (("empty", flush.empty), ("full", flush.full)):
        row = table.add(series.label, f"{series.stored_rows:,}", str(len(series.samples_s)), key=key)
        row.samples[FLUSH.name] = [s * 1e3 for s in series.samples_s]
        row.cells["p90 ms"] = f"{series.p90_s * 1e3:.2f}"
    return table


def _settings(result: BenchResult) -> Table:
    seen = list(dict.fromkeys(r.store for r in result.rows))
    return Table("Settings", ("store", "what", "settings"), rows=[Row((s.key, s.label, s.settings)) for s in seen])


def _notes(result: BenchResult) -> list[str]:
    notes = [
        f"vs {REFERENCE} = write+read time of {_REF_STORE.label} ({REFERENCE}) / this store's, same N "
        "(above 1 = faster).",
        f"Skip rule: {result.skip_rule}",
    ]
    if result.flush is not None:
        f = result.flush
        notes.append(
            f"Flush cost: {len(f.full.samples_s)} flushes per topic after one warm-up, topics alternating; "
            f"full/empty ratio median {f.median_ratio:.2f}x, p90 {f.p90_ratio:.2f}x (aim: within 2x). "
            f"Prefill of {f.full.stored_rows:,} rows took {f.prefill_s:.1f} s; reopening it {f.reopen_s:.2f} s."
        )
    return notes


def queue_report(result: BenchResult) -> Report:
    tables = [queue_table(result)]
    if result.flush is not None:
        tables.append(flush_table(result.flush))
    tables.append(_settings(result))
    return Report(
        "Queue benchmark",
        tables,
        _notes(result),
        meta={"records": 'about 100 bytes: {"id": int, "text": 70 random ASCII chars, "score": float}'},
        data={"reference": REFERENCE, "skip_rule": result.skip_rule, "flush": _flush_json(result.flush)},
        charts=lambda folder, subtitle: chart(result, folder, subtitle),
        wall_s=result.wall_s,
    )


def _flush_json(flush: FlushResult | None) -> dict[str, Any] | None:
    return None if flush is None else flush.to_json()


def chart(result: BenchResult, folder: Path, subtitle: str) -> list[Path]:
    """Write and read rates per store (log scale), one chart per N; the flush cost as box plots."""
    plt = pyplot()
    out = []
    for n in sorted({r.n for r in result.rows}):
        rows = [(r, r.timing) for r in result.rows if r.n == n and r.timing is not None]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
        labels = [f"{r.store.label}, {r.store.settings}"[:70] for r, _ in rows]
        ys = list(range(len(rows)))
        ax.barh([y + 0.2 for y in ys], [t.n / t.write_s for _, t in rows], 0.4, label="write rec/s")
        ax.barh([y - 0.2 for y in ys], [t.n / t.read_s for _, t in rows], 0.4, label="read rec/s")
        ax.set_yticks(ys, labels, fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel(f"records/s, N = {n:,}")
        ax.legend(fontsize=7)
        out.append(save(fig, folder, f"queue_rates_{n}.png", subtitle))
    if result.flush is not None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.boxplot(
            [[s * 1e3 for s in result.flush.empty.samples_s], [s * 1e3 for s in result.flush.full.samples_s]],
            tick_labels=["empty topic", "topic with rows stored"],
        )
        ax.set_ylabel("flush of 1,000 rows, ms")
        out.append(save(fig, folder, "queue_flush_cost.png", subtitle))
    return out
