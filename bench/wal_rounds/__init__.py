"""The ``wal-rounds`` suite: what one group-commit round of the write-ahead log costs beyond its fdatasync, by how
the round reaches its thread and by the GIL switch interval, with and without a thread holding the GIL; reference:
the round through ``asyncio.to_thread`` at CPython's default switch interval, in the same run. ``workload.py`` runs
one case in a fresh process (its docstring says how); the table is here. docs/benchmarks/broker.md has the
figures."""

from __future__ import annotations

import argparse

from bench.common.fresh_process import run_json
from bench.harness import BenchArgumentError, Context, Metric, Report, Suite, Table

REFERENCE = "asyncio.to_thread at 5 ms"


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--writers", type=int, default=2, help="coroutines putting at once (default 2, 1+)")
    p.add_argument("--commits", type=int, default=1000, help="commits per writer and run (default 1000, 1+)")
    p.add_argument("--frame-bytes", type=int, default=10_000, help="bytes per frame (default 10000: 100 records)")


def _run(ctx: Context) -> Report:
    from .workload import CASES, case_argv

    a = ctx.args
    if min(a.writers, a.commits, a.frame_bytes) < 1:
        raise BenchArgumentError("--writers, --commits and --frame-bytes must be at least 1")
    table = Table(
        f"{a.writers} writers x {a.commits} commits of {a.frame_bytes:,} B frames, each case in a fresh process",
        ("round via", "switch interval", "GIL-busy thread"),
        (Metric("commits/s"), Metric("wait p50 us", higher_is_better=False)),
        (REFERENCE,),
        runs=True,
    )
    runs: dict[tuple[str, float, bool], list[dict[str, float]]] = {}
    for rep in range(ctx.reps):
        ctx.say(f"rep {rep + 1} of {ctx.reps}")
        for busy in (False, True):
            for how, switch in CASES:
                argv = case_argv(how, switch, busy, a.writers, a.commits, a.frame_bytes)
                runs.setdefault((how, switch, busy), []).append(run_json("bench.wal_rounds.workload", argv, how))
    for (how, switch, busy), rs in sorted(runs.items(), key=lambda kv: kv[0][2]):
        via = "asyncio.to_thread" if how == "to_thread" else "the log's sync thread"
        table.add(via, f"{switch * 1e3:g} ms", "yes" if busy else "no", group=str(busy),
                        key=f"{via} at {switch * 1e3:g} ms", commits_s=[r["commits_per_s"] for r in rs],
                        wait_p50_us=[r["p50_us"] for r in rs])  # fmt: skip
    return Report("python -m bench wal-rounds: a group-commit round beyond its fdatasync", [table])


SUITE = Suite(
    name="wal-rounds",
    help="one group-commit round of the log beyond its fdatasync (a rep: every case once, each in a fresh process)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("uvloop",),
    work_prefix="pwr-",
)
