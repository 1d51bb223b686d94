"""The ``ray`` suite (the ray extra): tensor hand-over between two nodes of a local Ray cluster, persisting.ray's
brokers against ray.put/ray.get and memcpy in the same run. ``workload.py`` runs it (its docstring says how),
``report.py`` the table. docs/benchmarks/ray.md has the figures."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--small-batches", type=int, default=32, help="6 MiB batches per run (default 32; 0: none)")
    p.add_argument("--large-batches", type=int, default=6, help="64 MiB batches per run (default 6; 0: none)")


def _run(ctx: Context) -> Report:
    from .report import ray_report
    from .workload import run_ray_bench

    a = ctx.args
    if min(a.small_batches, a.large_batches) < 0 or not a.small_batches + a.large_batches:
        raise BenchArgumentError("--small-batches and --large-batches must be 0 or more, one of them at least 1")
    batches = {k: n for k, n in (("6 MiB", a.small_batches), ("64 MiB", a.large_batches)) if n}
    return ray_report(run_ray_bench(ctx.work, batches=batches, reps=ctx.reps, say=ctx.say), batches)


SUITE = Suite(
    name="ray",
    help="cross-node tensor hand-over on a local Ray cluster vs ray.put/ray.get (the ray extra; a rep: every path "
    "once per batch size)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("ray", "torch"),
    work_prefix="psr-",
)
