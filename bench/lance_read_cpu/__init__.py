"""The ``lance-read-cpu`` suite: what a read after the flush costs in CPU, the broker's and the consumer's (no
reference: the figures are per GB). ``workload.py`` runs it (its docstring says how); the table is here.
docs/benchmarks/multimodal-big.md ("After the flush") has the figures."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Metric, Report, Suite, Table


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gib", type=float, default=0.5, help="the batch, GiB of float32 (default 0.5, above 0)")
    p.add_argument("--arena-mib", type=int, default=256, help="the broker's arena, MiB (default 256, 1+)")


def _run(ctx: Context) -> Report:
    from .workload import run

    if ctx.args.gib <= 0 or ctx.args.arena_mib < 1:
        raise BenchArgumentError("--gib must be above 0, --arena-mib at least 1")
    figures, nbytes = run(ctx.work, ctx.args.gib, ctx.args.arena_mib, ctx.reps, ctx.seed)
    cpu = Metric("CPU s/GB", higher_is_better=False)
    table = Table(
        f"{nbytes / 1e9:.2f} GB through a {ctx.args.arena_mib} MiB arena, read whole after the flush (get_data)",
        ("figure",),
        (cpu,),
        runs=True,
    )
    for who in ("broker", "consumer", "total"):
        table.add(who, CPU_s_GB=figures[who])
    speed = Table("The same gets' speed", ("figure",), (Metric("GB/s"),), runs=True)
    speed.add("get", GB_s=figures["GB/s"])
    return Report("python -m bench lance-read-cpu: CPU of a read after the flush", [table, speed])


SUITE = Suite(
    name="lance-read-cpu",
    help="CPU seconds per GB of a read after the flush, broker and consumer (a rep: one get of the whole batch)",
    run=_run,
    arguments=_arguments,
    reps=2,
    work_prefix="lrc-",
)
