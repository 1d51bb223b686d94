"""The ``queue`` suite: small records (about 100 bytes) written and read back through persisting's ``Queue``
(``durability="sync"`` and ``"process"``) and, in the same run, through persist-queue 1.1.0 (``SQLiteQueue``, the
reference, and the file-based ``Queue``); then the cost of a flush of 1,000 rows on an empty topic against a topic
that already holds many rows. ``stores.py``: the stores; ``workload.py``: the run; ``report.py``: tables, chart."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, action="append", help="record count; repeat for several (default 10000)")
    p.add_argument("--peer-limit-s", type=float, default=180.0, help="skip a peer projected slower than this")
    p.add_argument("--flush-prefill", type=int, default=1_000_000, help="rows stored before the flush test; 0: skip")
    p.add_argument("--flush-reps", type=int, default=20, help="timed flushes per topic")


def _run(ctx: Context) -> Report:
    from .report import queue_report
    from .workload import run_queue_bench

    a = ctx.args
    ns = a.n or [10_000]
    if any(n < 1 for n in ns) or a.flush_prefill < 0 or a.flush_reps < 1:
        raise BenchArgumentError("--n and --flush-reps must be at least 1, --flush-prefill 0 or more")
    result = run_queue_bench(
        ns,
        ctx.work,
        peer_limit_s=a.peer_limit_s,
        flush_prefill=a.flush_prefill,
        flush_reps=a.flush_reps,
        seed=ctx.seed,
        reps=ctx.reps,
        progress=ctx.progress,
    )
    return queue_report(result)


SUITE = Suite(
    name="queue",
    help="persisting Queue vs persist-queue: write, read, flush cost (one run per store and N by default)",
    run=_run,
    arguments=_arguments,
    reps=1,
    work_prefix="persisting-bench-",
)
