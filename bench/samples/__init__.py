"""The ``samples`` suite: ``get_meta`` (``GRPOGroupNSampler``) through the broker, 2 producers and 4 consumers of one
task, against the protocol's ``hello`` round trip and TransferQueue's ``get_meta``, with the throughput floor of
bare round trips measured in the same run. ``workload.py`` runs it; ``floor.py`` the floor;
``transferqueue_peer.py`` the TransferQueue reference; ``report.py`` and ``chart.py`` show them."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--puts", type=int, default=250, help="puts of 64 samples per producer (default 250)")
    s.add_argument(
        "--put-interval-ms", type=float, default=0.0, help="each producer puts once per this many ms (0: flat out)"
    )
    s.add_argument("--latency-n", type=int, default=2_000, help="timed calls per reference series (hello, get_meta)")
    s.add_argument("--warmup", type=int, default=200, help="untimed calls per reference series first")
    s.add_argument("--get-timeout", type=float, default=0.5, help="the consumers' get_meta(wait=True, timeout=...)")
    s.add_argument("--no-transferqueue", action="store_true", help="skip the TransferQueue reference (Ray)")


def _run(ctx: Context) -> Report:
    from .report import samples_report
    from .workload import run_samples_bench

    a = ctx.args
    if a.puts < 1 or a.latency_n < 1 or a.warmup < 0 or a.get_timeout <= 0 or a.put_interval_ms < 0:
        raise BenchArgumentError(
            "--puts and --latency-n must be at least 1, --warmup and --put-interval-ms at least 0, "
            "--get-timeout above 0"
        )
    result = run_samples_bench(
        ctx.work,
        puts=a.puts,
        put_interval_s=a.put_interval_ms / 1e3,
        latency_n=a.latency_n,
        warmup=a.warmup,
        get_timeout=a.get_timeout,
        seed=ctx.seed,
        progress=ctx.progress,
        tq_ref=not a.no_transferqueue,
    )
    report = samples_report(result)
    report.meta["records"] = 'tensor batches {"x": float32[64, 16], "len": 64 ints}: 64 samples = 8 GRPO groups of n=8'
    report.meta["broker"] = (
        "python -m broker --storage-path <work dir>/storage --socket ipc://<work dir>/s/b.sock --log-level WARNING"
    )
    return report


SUITE = Suite(
    name="samples",
    help="get_meta (GRPOGroupNSampler) through the broker: 2 producers, 4 consumers of one task, vs the protocol's "
    "hello round trip (one run)",
    run=_run,
    arguments=_arguments,
    reps=1,
    once="its figures are percentiles of many calls and one workload within one run",
    packages=("pyzmq", "transferqueue", "ray"),
    work_prefix="psb-",
)
