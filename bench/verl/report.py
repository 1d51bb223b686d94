"""The tables of ``python -m bench verl``: time per step (and its rollout and trainer parts) and peak RSS per
role, persisting's TransferQueue layer against TransferQueue in the same run."""

from __future__ import annotations

import argparse
from typing import Any

from bench.harness import Metric, Report, Table

REFERENCE = "transferqueue"
PARTS = (("step_s", "time per step"), ("rollout_s", "rollout puts"), ("train_s", "trainer's part"))


def verl_report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, notes: list[str]) -> Report:
    """``runs``: backend -> one result per run (bench/verl/one.py)."""
    refs = (REFERENCE,) if REFERENCE in runs else ()
    steps = Table("Time per step (each run: the mean of its steps)", ("part", "backend"),
                  (Metric("ms", higher_is_better=False),), refs, runs=True)  # fmt: skip
    for key, part in PARTS:
        for backend, rs in runs.items():
            steps.add(part, backend, group=part, ms=[r[key] * 1e3 for r in rs])
    rss = Table("Peak RSS (VmHWM) of the run's processes, by role", ("role", "backend"),
                (Metric("MiB", higher_is_better=False, digits=4),), refs, runs=True)  # fmt: skip
    roles = sorted({role for rs in runs.values() for r in rs for role in r["peak_rss_mib"]})
    for role in [*roles, "all processes"]:
        for backend, rs in runs.items():
            values = [_rss(r["peak_rss_mib"], role) for r in rs]
            rss.add(role, backend, group=role, MiB=values)
    shape = (
        f"{args.workers} rollout workers, {args.prompts} prompts x n={args.n} = {args.prompts * args.n} trajectories "
        f"per step (prompt 128-511, response 256-1023 tokens), dp={args.dp}, {args.steps} steps after a warm-up"
    )
    return Report("python -m bench verl: a verl-shaped step, the TransferQueue layer vs TransferQueue",
                  [steps, rss], [shape, *notes], data={"runs": runs})  # fmt: skip


def _rss(peaks: dict[str, float], role: str) -> float:
    return sum(peaks.values()) if role == "all processes" else peaks.get(role, 0.0)
