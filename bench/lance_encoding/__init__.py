"""The ``lance-encoding`` suite: what Lance's encoder costs per GB of a dense tensor column, by file format, field
metadata and Arrow layout; whether each format keeps the typed storage; the writer's column appended in pieces.
No reference row: the cases are compared with each other. ``workload.py`` runs it (its docstring says how); the
tables are here. docs/benchmarks/multimodal-big.md and docs/concepts/on-disk.md have the figures."""

from __future__ import annotations

import argparse
from typing import Any

from bench.harness import BenchArgumentError, Context, Metric, Report, Suite, Table


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mib", type=int, default=256, help="payload per write, MiB (default 256, 1+)")


def _run(ctx: Context) -> Report:
    import lance
    import pyarrow as pa

    from .workload import run

    if ctx.args.mib < 1:
        raise BenchArgumentError("--mib must be at least 1")
    rows = run(ctx.args.mib, ctx.reps, ctx.work)
    title = (
        f"lance {lance.__version__}, pyarrow {pa.__version__}: write_dataset of {ctx.args.mib} MiB in one column "
        "(rows of 1 MiB) + fsync"
    )
    return Report("python -m bench lance-encoding: Lance's encoder per GB of a tensor column", _tables(rows, title))


def _tables(rows: list[dict[str, Any]], title: str) -> list[Table]:
    cpu = Metric("CPU s/GB", higher_is_better=False)
    writes = Table(title, ("layout", "dtype", "field metadata", "format"), (cpu, Metric("GB/s")), runs=True)
    typed = Table("Keeps the typed storage (null structs, columns added as nulls)", ("format", "keeps it"))
    pieces = Table("The writer's column appended in pieces (write_fragments)", ("pieces of",), (cpu,), runs=True)
    for r in rows:
        if "runs" in r:
            meta = ", ".join(f"{k}={v}" for k, v in r["meta"].items()) or "(none)"
            samples: dict[str, Any] = {"CPU_s_GB": [c for c, _ in r["runs"]], "GB_s": [g for _, g in r["runs"]]}
            writes.add(r["layout"], r["dtype"], meta, r["format"], **samples)
        elif "typed_storage" in r:
            typed.add(r["format"], r["typed_storage"])
        else:
            pieces.add(f"{r['piece_mib']} MiB", CPU_s_GB=r["cpu"])
    return [writes, typed, pieces]


SUITE = Suite(
    name="lance-encoding",
    help="Lance encodings of tensor columns: write cost per GB by format, metadata and layout (a rep: each write once)",
    run=_run,
    arguments=_arguments,
    reps=3,
    work_prefix="ple-",
)
