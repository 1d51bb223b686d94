"""``python -m bench``: the list of suites and probes (no arguments), or one of them run. For a suite the harness
builds the parser (the suite's flags, then the common ones), makes the work folder, runs it, adds the run's
metadata and renders the report."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import discover
from .meta import git_revision, run_meta
from .plots import run_label
from .render import FORMATS, default_charts, render
from .report import Report
from .suite import BenchArgumentError, Context, Suite
from .workdir import work_dir

CLOSING_NOTE = "Timings are from one run on a shared machine: compare ratios within it, not across runs."


def listing() -> str:
    """Every suite and probe, one line each."""
    suites = {name: s.help for name, s in discover.suites().items()}
    probes = {name: p.help for name, p in discover.probes().items()}
    width = max(map(len, [*suites, *probes]))
    lines = ["usage: python -m bench NAME [--help | options]", "", "suites:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in sorted(suites.items())]
    lines += ["", "probes (diagnostics of one step, their own output):"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in probes.items()]
    return "\n".join(lines)


def parser(suite: Suite) -> argparse.ArgumentParser:
    """``python -m bench NAME``'s parser: the suite's own flags, then the common ones."""
    p = argparse.ArgumentParser(prog=f"python -m bench {suite.name}", description=suite.help)
    suite.arguments(p)
    common = p.add_argument_group("common to every suite")
    reps_help = f"this suite runs once: {suite.once}" if suite.once else "repetitions, medians reported"
    common.add_argument("--reps", type=int, default=suite.reps, help=f"{reps_help} (default {suite.reps})")
    for old in suite.reps_aliases:
        common.add_argument(old, dest="reps", type=int, help=argparse.SUPPRESS)
    common.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    common.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    common.add_argument("--format", choices=FORMATS, default="console", help="the report's form (default console)")
    common.add_argument("--plot", type=Path, metavar="DIR", help="also write PNG charts of the run to DIR")
    common.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    return p


def run_suite(suite: Suite, argv: Sequence[str]) -> int:
    """``argv``: the command line after ``python -m bench`` (the suite's name first). The exit status: 0, or 1
    when the report says the run failed (``Report.failed``, its reasons on stderr)."""
    p = parser(suite)
    args = p.parse_args(argv[1:])
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if suite.once and args.reps != 1:
        p.error(f"--reps must be 1: {suite.once}; run the command again for another run")
    revision = git_revision()  # before the run: the code measured is the code imported now
    with work_dir(args.dir, suite.work_prefix) as work:
        meta = run_meta(argv, revision, work, args.seed, suite.packages)
        ctx = Context(args, work, args.reps, args.seed, not args.no_progress, args.plot, suite.name)
        t0 = time.monotonic()
        try:
            report = suite.run(ctx)
        except BenchArgumentError as exc:
            p.error(str(exc))
        report.wall_s = report.wall_s or time.monotonic() - t0
    meta.update(report.meta)
    meta["load average (1 min) at end"] = f"{os.getloadavg()[0]:.2f}"
    report.notes.append(f"Whole run: {report.wall_s:.1f} s wall. {CLOSING_NOTE}")
    print(render(report, meta, args.format))
    if args.plot is not None:
        _charts(report, meta, args.plot)
    for reason in report.failed:
        print(f"python -m bench {suite.name}: failed: {reason}", file=sys.stderr)
    return 1 if report.failed else 0


def _charts(report: Report, meta: dict[str, object], folder: Path) -> None:
    """The run's charts; their paths go to stderr (stdout holds the report)."""
    label = run_label(meta)
    paths = report.charts(folder, label) if report.charts else default_charts(report, label, folder)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(listing())
        return 0
    name = args[0]
    suites = discover.suites()
    if name in suites:
        return run_suite(suites[name], args)
    probes = discover.probes()
    if name in probes:
        return int(probes[name].main(args[1:]) or 0)
    raise SystemExit(f"python -m bench: no suite or probe named {name!r}; `python -m bench` lists them")
