"""The ``chaos`` suite: kill -9 of producers, consumers and the broker at random moments, then fuzzed frames at the
broker's socket; what was lost, stored twice or leaked. ``workload.py`` runs the phases (its docstring says them),
``worker.py`` is a client process it kills, ``report.py`` the figures. No reference: every figure that matters
must be 0. ``--seed`` picks the schedule (a run's seed replays it, not its timing)."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=100, help="kill -9 trials per phase (default 100, 1+)")
    p.add_argument("--frames", type=int, default=10_000, help="fuzzed frames (default 10000, 0+)")


def _run(ctx: Context) -> Report:
    from .report import chaos_report
    from .workload import run

    if ctx.args.trials < 1 or ctx.args.frames < 0:
        raise BenchArgumentError("--trials must be at least 1, --frames at least 0")
    return chaos_report(run(ctx.work, ctx.args.trials, ctx.args.frames, ctx.seed, ctx.say))


SUITE = Suite(
    name="chaos",
    help="kill -9 of producers, consumers and the broker, and fuzzed frames: nothing lost, duplicated or leaked "
    "(one run; --reps is not used)",
    run=_run,
    arguments=_arguments,
    reps=1,
    work_prefix="pch-",
)
