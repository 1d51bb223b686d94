"""The ``broker`` suite: persisting through ``persisting-broker`` against the raw ZeroMQ round trip it rides on, and
a 2-producer / 2-consumer workload through the broker against persist-queue's ``SQLiteAckQueue`` shared by the
same four processes. ``workload.py`` runs the parts in order; ``latency.py`` the round trips, ``throughput.py`` the
2x2 runs (persist-queue's in ``persistqueue_peer.py``); ``report.py`` and ``chart.py`` show them."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--latency-n", type=int, default=2_000, help="timed sequential requests per latency series")
    b.add_argument("--warmup", type=int, default=200, help="untimed requests per latency series first")
    b.add_argument(
        "--records", type=int, default=200_000, help="records through the broker per 2x2 run (multiple of 200)"
    )
    b.add_argument(
        "--durability",
        action="append",
        choices=("sync", "process"),
        help="2x2 runs through the broker; repeat for several (default: sync and process)",
    )
    b.add_argument("--pq-records", type=int, default=20_000, help="records in the persist-queue 2x2 run; 0: skip")
    b.add_argument("--pq-limit-s", type=float, default=20.0, help="time limit of each persist-queue worker")


def _run(ctx: Context) -> Report:
    from .report import broker_report
    from .workload import run_broker_bench

    a = ctx.args
    if a.latency_n < 1 or a.warmup < 0 or a.records < 0 or a.pq_records < 0:
        raise BenchArgumentError("--latency-n must be at least 1; --warmup, --records and --pq-records at least 0")
    if a.records % 200:
        raise BenchArgumentError("--records must be a multiple of 200 (2 producers x put_batch of 100)")
    durabilities = tuple(dict.fromkeys(a.durability or ["sync", "process"])) if a.records else ()
    result = run_broker_bench(
        ctx.work,
        latency_n=a.latency_n,
        warmup=a.warmup,
        records=a.records,
        durabilities=durabilities,
        pq_records=a.pq_records - a.pq_records % 2,
        pq_limit_s=a.pq_limit_s,
        seed=ctx.seed,
        progress=ctx.progress,
    )
    report = broker_report(result)
    report.meta["records"] = 'about 100 bytes: {"id": int, "text": 70 random ASCII chars, "score": float}'
    report.meta["broker"] = "python -m broker --storage-path <work dir>/storage --socket ipc://<work dir>/sock/b.sock"
    return report


SUITE = Suite(
    name="broker",
    help="put round trip vs raw ZeroMQ; 2x2 processes through the broker vs persist-queue SQLiteAckQueue (one run)",
    run=_run,
    arguments=_arguments,
    reps=1,
    once="its figures are percentiles of many requests and whole 2x2 runs within one run",
    work_prefix="pbb-",
)
