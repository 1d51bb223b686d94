"""The ``pq`` suite: persist-queue's API, persist-queue 1.1.0 beside ``persisting.compat.persistqueue`` in the same
run. ``items.py`` is persist-queue's own per-item workload (and the fdatasync floor of a ``sync`` put),
``multiprocess.py`` 2 producer + 2 consumer processes on one SQLiteAckQueue path (persist-queue directly on the
path; the compat layer through a broker), ``report.py`` the tables. docs/benchmarks/pq.md has the figures."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite

PARTS = ("all", "items", "multiprocess")


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=1000, help="items put then got per class and rep (default 1000, 1+)")
    p.add_argument("--mp-n", type=int, default=2000, help="records per producer in the 2 + 2 case (default 2000)")
    p.add_argument(
        "--mp-repeat", type=int, default=3, help="runs of the 2 + 2 case per library, alternating (default 3)"
    )
    p.add_argument("--parts", choices=PARTS, default="all", help="the per-item table, the 2 + 2 case, or both")


def _run(ctx: Context) -> Report:
    from .items import run_items
    from .multiprocess import run
    from .report import pq_report

    a = ctx.args
    if a.n < 1 or a.mp_n < 1 or a.mp_repeat < 1:
        raise BenchArgumentError("--n, --mp-n and --mp-repeat must be at least 1")
    items = run_items(ctx.work, a.n, ctx.reps, ctx.say) if a.parts != "multiprocess" else None
    runs = run(ctx.work, a.mp_n, a.mp_repeat, ctx.say) if a.parts != "items" else None
    return pq_report(items, a.n, runs)


SUITE = Suite(
    name="pq",
    help="persist-queue's API: persist-queue beside persisting.compat.persistqueue, per item and 2 + 2 processes "
    "(a rep: every class once per library)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("persist-queue",),
    work_prefix="pqb-",
)
