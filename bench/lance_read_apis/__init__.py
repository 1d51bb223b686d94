"""The ``lance-read-apis`` suite: CPU seconds per GB of each of pylance's read calls on one dense tensor column,
against plain ``read`` calls of the same data files in the same run. ``workload.py`` runs it (its docstring says
how); the table is here. docs/benchmarks/multimodal-big.md has the figures."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Metric, Report, Suite, Table


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gib", type=float, default=0.5, help="the column, GiB of float32 (default 0.5, above 0)")


def _run(ctx: Context) -> Report:
    import lance

    from .workload import PLAIN, run

    if ctx.args.gib <= 0:
        raise BenchArgumentError("--gib must be above 0")
    cpu, gbps, nbytes = run(ctx.work, ctx.args.gib, ctx.reps, ctx.seed)
    table = Table(
        f"lance {lance.__version__}: a {nbytes / 2**30:.2f} GiB float32 column, read in pieces of 64 MiB",
        ("read",),
        (Metric("CPU s/GB", higher_is_better=False), Metric("GB/s")),
        (PLAIN,),
        runs=True,
    )
    for name in cpu:
        table.add(name, CPU_s_GB=cpu[name], GB_s=gbps[name])
    return Report("python -m bench lance-read-apis: CPU per GB of pylance's read calls", [table])


SUITE = Suite(
    name="lance-read-apis",
    help="CPU seconds per GB of pylance's read APIs on a tensor column vs plain reads (a rep: each call once)",
    run=_run,
    arguments=_arguments,
    reps=3,
    work_prefix="lra-",
)
