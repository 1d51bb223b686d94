"""The ``persist`` suite's report: the sustained stream into Lance against file write + fdatasync (and against one
encoder), the encoding comparison, and the flush cost against stored data."""

from __future__ import annotations

import statistics

from bench.harness import Metric, Report, Table

from .workload import PersistResult

GBPS = Metric("GB/s")
CORES = Metric("broker CPU cores used", higher_is_better=False)
PAIRED = "vs the disk run just before it (median of the runs' ratios)"


def stream_table(result: PersistResult) -> Table:
    table = Table(
        f"Sustained stream through the broker into Lance ({result.stream_bytes / 1e9:.2f} GB per run; the disk "
        "reference runs before every broker run)",
        ("encoders",),
        (GBPS, CORES),
        ("disk", "encoders=1"),
        (PAIRED,),
        runs=True,
    )
    for label, values in result.stream.items():
        name = "file write + fdatasync (reference)" if label == "disk" else label.removeprefix("encoders=")
        row = table.add(name, key=label, GB_s=values)
        if label != "disk":
            row.samples[CORES.name] = result.cores[label]
            row.cells[PAIRED] = f"{_paired(result, label):.2f}x"
    return table


# Not the harness's ratio (a ratio of medians): the median of each broker run's ratio to the disk run just before
# it, so that a slow spell of the shared disk hits both sides of a pair.
def _paired(result: PersistResult, label: str) -> float:
    """The median over runs of (GB/s of the run) / (GB/s of the disk reference measured just before it)."""
    n = int(label.removeprefix("encoders="))
    disks = [d for d, e in zip(result.stream["disk"], result.pairs, strict=True) if e == n]
    return statistics.median(v / d for v, d in zip(result.stream[label], disks, strict=True))


def encoding_table(result: PersistResult) -> Table:
    cpu, size = Metric("CPU s/GB", higher_is_better=False), Metric("bytes on disk", higher_is_better=False, digits=10)
    table = Table("Encoding of a fixed-shape float32 tensor column, one write_dataset", ("column metadata",))
    table.metrics = (cpu, size)
    for label, figures in result.encoding.items():
        row = table.add(label)
        row.samples = {cpu.name: [f[0] for f in figures], size.name: [float(f[1]) for f in figures]}
    return table


def flush_table(result: PersistResult) -> Table:
    """Per run, the p50 and p90 of 20 flushes per topic; the medians over runs; full against empty (a cost)."""
    p50, p90 = Metric("p50 ms", higher_is_better=False), Metric("p90 ms", higher_is_better=False)
    table = Table(
        "Flush of 1,000 rows, 20 flushes per topic per run", ("topic",), (p50, p90), ("empty",), plain_ratio=True
    )
    for attr in ("empty", "full"):
        series = [getattr(f, attr) for f in result.flush]
        row = table.add(f"{attr} ({series[0].stored_rows:,} rows)", key=attr)
        row.samples = {p50.name: [s.median_s * 1e3 for s in series], p90.name: [s.p90_s * 1e3 for s in series]}
    return table


def persist_report(result: PersistResult) -> Report:
    tables = [stream_table(result), encoding_table(result)]
    if result.flush:
        tables.append(flush_table(result))
    notes = [
        "vs disk and vs encoders=1: ratios of the medians over runs; the flush table's vs empty: full / empty "
        "(a cost: above 1 costs more)."
    ]
    return Report("Persist benchmark", tables, notes, data={"stream_bytes": result.stream_bytes})
