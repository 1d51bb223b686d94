"""The ``arena`` suite: tensor batches producer -> consumer through the broker's shared-memory arena, against memcpy
of the same bytes, ``torch.multiprocessing.Queue`` and TransferQueue, in one run. ``workload.py`` runs the cases;
``batches.py`` the batches; ``pair.py`` a producer/consumer pair and its result; the peers: ``persisting_peer.py``,
``torch_peer.py``, ``transferqueue_peer.py``; ``views.py`` the zero-copy check; ``report.py``, ``chart.py``."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite

from .batches import POOL


def _arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument("--small-batches", type=int, default=256, help="6 MiB batches per stream run (default: 1.5 GiB)")
    a.add_argument("--large-batches", type=int, default=24, help="64 MiB batches per stream run (default: 1.5 GiB)")
    a.add_argument("--paced-batches", type=int, default=16, help="batches per paced (idle pipe) latency run; 0: skip")
    a.add_argument("--arena-bytes", type=int, default=2 * 1024**3, help="the broker's arena (default 2 GiB)")
    a.add_argument(
        "--beyond-batches", type=int, default=128, help="6 MiB batches through a small arena (see next); 0: skip"
    )
    a.add_argument(
        "--beyond-arena-bytes", type=int, default=256 * 1024**2, help="arena of the beyond run (default 256 MiB)"
    )
    a.add_argument(
        "--in-flight",
        type=int,
        default=2,
        help=f"puts the in-flight stream row keeps running on one Queue (2-{POOL}; default 2); 1: no such row",
    )
    a.add_argument("--no-torch", action="store_true", help="skip the torch.multiprocessing.Queue reference")
    a.add_argument("--no-transferqueue", action="store_true", help="skip the TransferQueue rows (Ray)")
    a.add_argument(
        "--consumer-reads",
        action="store_true",
        help="consumers read every byte of each batch before counting it received (the cost of using the data)",
    )


def _run(ctx: Context) -> Report:
    from .report import arena_report
    from .workload import run_arena_bench

    a = ctx.args
    counts = (a.small_batches, a.large_batches, a.paced_batches, a.beyond_batches)
    if any(n < 0 for n in counts) or a.arena_bytes < 1 or a.beyond_arena_bytes < 1:
        raise BenchArgumentError("batch counts must be at least 0, arena sizes at least 1")
    if not 1 <= a.in_flight <= POOL:  # a source batch is stamped again only once its put has copied it
        raise BenchArgumentError(f"--in-flight must be 1 to {POOL} (the producer's pool of source batches)")
    result = run_arena_bench(
        ctx.work,
        small_batches=a.small_batches,
        large_batches=a.large_batches,
        paced_batches=a.paced_batches,
        arena_bytes=a.arena_bytes,
        beyond_batches=a.beyond_batches,
        beyond_arena_bytes=a.beyond_arena_bytes,
        torch_ref=not a.no_torch,
        tq_ref=not a.no_transferqueue,
        seed=ctx.seed,
        progress=ctx.progress,
        consumer_reads=a.consumer_reads,
        plot=ctx.plot is not None,
        in_flight=a.in_flight,
    )
    report = arena_report(result)
    report.meta["records"] = (
        "tensor batches: 256 x (int64[1024] + float32[4096]) (6 MiB) and 64 x float32[262144] (64 MiB)"
    )
    report.meta["broker"] = (
        "python -m broker --storage-path <work dir>/<case>/storage --socket ipc://<work dir>/<case>/s/b.sock "
        "--arena-bytes N --log-level WARNING (one broker per persisting case)"
    )
    return report


SUITE = Suite(
    name="arena",
    help="tensor batches through the broker's shared-memory arena vs memcpy, torch.multiprocessing.Queue and "
    "TransferQueue (one run)",
    run=_run,
    arguments=_arguments,
    reps=1,
    once="its figures are per-case runs of many batches, percentiles within one run",
    packages=("torch", "transferqueue", "ray"),
    work_prefix="pab-",
)
