"""The ``chaos`` suite: kill -9 of producers, consumers and the broker at random moments, then fuzzed frames at the
broker's socket; what was lost, stored twice or leaked. ``workload.py`` runs the phases (its docstring says them),
``worker.py`` is a client process it kills, ``report.py`` the figures. Then the tensor scenario
(``tensor_kills.py``, ``tensor_worker.py``): ``--tensor-kills`` SIGKILLs of a broker under 6 MiB batches into an
8 MiB arena while its bucket compacts. ``--only clients`` or ``--only tensors`` runs one part. No reference: every
figure that matters must be 0. ``--seed`` picks the schedule (a run's seed replays it, not its timing)."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=100, help="kill -9 trials per phase (default 100, 1+)")
    p.add_argument("--frames", type=int, default=10_000, help="fuzzed frames (default 10000, 0+)")
    p.add_argument(
        "--tensor-kills",
        type=int,
        default=100,
        help="broker SIGKILLs of the tensor scenario: 6 MiB batches into an 8 MiB arena, compacting (default 100, 1+)",
    )
    p.add_argument(
        "--only",
        choices=("clients", "tensors"),
        help="run only the four phases of kills and fuzz (clients) or only the tensor scenario (default: both)",
    )


def _run(ctx: Context) -> Report:
    from . import tensor_kills
    from .report import chaos_report
    from .workload import run

    if ctx.args.trials < 1 or ctx.args.frames < 0 or ctx.args.tensor_kills < 1:
        raise BenchArgumentError("--trials and --tensor-kills must be at least 1, --frames at least 0")
    args = ctx.args
    clients = None if args.only == "tensors" else run(ctx.work, args.trials, args.frames, ctx.seed, ctx.say)
    tensors = None if args.only == "clients" else tensor_kills.run(ctx.work, args.tensor_kills, ctx.seed, ctx.say)
    return chaos_report(clients, tensors)


SUITE = Suite(
    name="chaos",
    help="kill -9 of producers, consumers and the broker, and fuzzed frames: nothing lost, duplicated or leaked "
    "(one run; --reps is not used)",
    run=_run,
    arguments=_arguments,
    reps=1,
    work_prefix="pch-",
)
