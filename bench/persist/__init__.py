"""The ``persist`` suite: how fast tensor batches leave the broker's arena for Lance, with 1, 2 and all encoders,
against file write + fdatasync of the same bytes; the encoding of a tensor column; a flush into an empty topic
against one into a 1M-row topic (``workload.py`` says how; ``report.py`` shows it)."""

from __future__ import annotations

import argparse
import os

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(w: argparse.ArgumentParser) -> None:
    w.add_argument("--arena-mib", type=int, default=256, help="the broker's arena (default 256 MiB)")
    w.add_argument("--stream-factor", type=int, default=4, help="the stream is this many times the arena (default 4)")
    w.add_argument(
        "--encoders", type=int, action="append", help="encoder threads of a run; repeat (default: 1, 2, all cores)"
    )
    w.add_argument("--table-mib", type=int, default=256, help="table of the encoding comparison (default 256 MiB)")
    w.add_argument("--flush-prefill", type=int, default=1_000_000, help="rows stored before the flush test; 0: skip")


def _run(ctx: Context) -> Report:
    from .report import persist_report
    from .workload import run_persist_bench

    a = ctx.args
    encoders = list(dict.fromkeys(a.encoders or [1, 2, len(os.sched_getaffinity(0))]))
    if min(encoders) < 1 or a.arena_mib < 1 or a.stream_factor < 1 or a.flush_prefill < 0 or a.table_mib < 1:
        raise BenchArgumentError("--encoders, --arena-mib, --stream-factor, --table-mib at least 1, --flush-prefill 0+")
    result = run_persist_bench(
        ctx.work,
        arena_mib=a.arena_mib,
        stream_factor=a.stream_factor,
        encoders=encoders,
        table_mib=a.table_mib,
        flush_prefill=a.flush_prefill,
        runs=ctx.reps,
        seed=ctx.seed,
        progress=ctx.progress,
    )
    report = persist_report(result)
    report.meta["records"] = (
        "tensor batches {'x': float32[16, 262144]} (16 MiB); flush test: about 100 bytes: "
        '{"id": int, "text": 70 random ASCII chars, "score": float}'
    )
    report.meta["broker"] = (
        "python -m broker --storage-path <work dir>/stream-N/storage --socket ipc://<work dir>/stream-N/s/b.sock "
        "--arena-bytes A --log-level WARNING, with PERSISTING_LANCE_ENCODERS=N (one broker per run)"
    )
    return report


SUITE = Suite(
    name="persist",
    help="tensor batches leaving the arena for Lance vs file write + fdatasync, with 1, 2 and all encoders; flush "
    "p50/p90 into an empty vs a 1M-row topic",
    run=_run,
    arguments=_arguments,
    reps=3,
    reps_aliases=("--runs",),
    work_prefix="pps-",
)
