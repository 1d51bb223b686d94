"""The ``storage`` suite: flush and read throughput of a topic on a local S3 server (moto's, a subprocess on
127.0.0.1; the s3 extra) beside the same topic on local disk, in one run. ``workload.py`` runs it (its docstring
says how), ``report.py`` the tables. docs/benchmarks/storage.md has the figures."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=int, default=100_000, help="small records per run (default 100000, 1+)")
    p.add_argument("--tensors", type=int, default=512, help="tensor records per run (default 512, 1+)")
    p.add_argument("--tensor-kib", type=int, default=256, help="KiB of float32 per tensor record (default 256, 1+)")


def _run(ctx: Context) -> Report:
    from .report import storage_report
    from .workload import run_storage_bench

    a = ctx.args
    if min(a.records, a.tensors, a.tensor_kib) < 1:
        raise BenchArgumentError("--records, --tensors and --tensor-kib must be at least 1")
    series = run_storage_bench(
        ctx.work, n_small=a.records, n_tensor=a.tensors, tensor_kib=a.tensor_kib, reps=ctx.reps, seed=ctx.seed
    )
    return storage_report(series)


SUITE = Suite(
    name="storage",
    help="flush and read throughput: a topic on a local S3 server (moto) vs local disk (the s3 extra; a rep: each "
    "store once per workload)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("moto", "boto3"),
    work_prefix="pso-",
)
