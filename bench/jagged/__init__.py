"""The ``jagged`` suite: jagged int64 token batches (``torch.nested``) from a producer process to a consumer process
through the broker, against the same batches padded and against ``torch.multiprocessing.Queue``
(``workload.py`` says how)."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(j: argparse.ArgumentParser) -> None:
    j.add_argument("--samples", type=int, default=256, help="sequences per batch (default 256)")
    j.add_argument("--min-len", type=int, default=100, help="shortest sequence (default 100)")
    j.add_argument("--max-len", type=int, default=4000, help="longest sequence, the padded width (default 4000)")
    j.add_argument("--batches", type=int, default=32, help="batches per run (default 32)")
    j.add_argument(
        "--cases",
        default=None,
        help="comma-separated cases to run, of 'persisting jagged', 'persisting padded', 'torch.mp jagged', "
        "'torch.mp padded' (default all; 'persisting jagged', the reference, always runs)",
    )


def _run(ctx: Context) -> Report:
    from .workload import CASES, jagged_report, run_jagged_bench

    a = ctx.args
    if a.samples < 1 or a.batches < 1 or not 1 <= a.min_len <= a.max_len:
        raise BenchArgumentError("--samples and --batches must be at least 1, 1 <= --min-len <= --max-len")
    names = [name for name, _, _ in CASES]
    picked = names if a.cases is None else [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = sorted(set(picked) - set(names))
    if unknown:
        raise BenchArgumentError(f"--cases: no case {unknown}; the cases: {', '.join(names)}")
    a.cases = [n for n in names if n in picked or n == names[0]]
    return jagged_report(run_jagged_bench(ctx.work, a), a)


SUITE = Suite(
    name="jagged",
    help="jagged int64 token batches through the broker vs padded and vs torch.multiprocessing.Queue",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("torch",),
    work_prefix="psj-",
)
