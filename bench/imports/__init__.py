"""The ``imports`` suite: a fresh process's import of persisting against persist-queue's, and optionally against a
second checkout in the same runs (``workload.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--against", type=Path, help="another checkout to time in the same runs (before/after)")


def _run(ctx: Context) -> Report:
    from .workload import imports_report

    against = ctx.args.against
    if against is not None and not (against / "persisting" / "__init__.py").is_file():
        raise BenchArgumentError(f"--against {against}: no persisting/__init__.py there; give a checkout's root")
    return imports_report(ctx.reps, against)


SUITE = Suite(
    name="imports",
    help="a fresh process's import of persisting vs import persistqueue (--reps: fresh processes per statement)",
    run=_run,
    arguments=_arguments,
    reps=5,
    reps_aliases=("--runs",),
    work_prefix="pim-",
)
