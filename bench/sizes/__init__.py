"""The ``sizes`` suite (issue 31): one tensor batch at each size from 1 MiB to 4 GiB, producer process -> consumer
process through a broker with its default settings, beside ``torch.multiprocessing.Queue`` and memcpy of the same
bytes in the same run; then a steady stream of 1 GiB batches. ``workload.py`` runs it (its docstring holds the
decisions), ``worker.py`` is the two processes, ``report.py`` the tables, the aims and the chart.

The worked example of a suite on the harness (bench/harness/__init__.py says how): this module declares, the
workload is imported only when the suite runs (``python -m bench`` lists suites without importing torch)."""

from __future__ import annotations

from bench.harness import Context, Report, Suite


def _run(ctx: Context) -> Report:
    from .report import sizes_report
    from .workload import run_sizes_bench, settings

    batch_sizes, stream_bytes = settings(ctx.args)
    a = ctx.args
    result = run_sizes_bench(ctx.work, batch_sizes, ctx.reps, stream_bytes, a.stream_batches, a.hellos, ctx.progress)
    return sizes_report(result)


def _arguments(parser: object) -> None:
    from .workload import add_args

    add_args(parser)


SUITE = Suite(
    name="sizes",
    help="one batch at 1 MiB to 4 GiB and a stream of 1 GiB batches through a default broker, producer -> consumer "
    "process, vs torch.multiprocessing.Queue and memcpy (issue 31)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("torch",),
    work_prefix="psz-",
)
