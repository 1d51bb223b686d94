"""The ``verl-nodes`` suite: one verl-sized step through the TransferQueue layer on two Ray nodes (a worker on B
writing into and reading from a partition A owns) against the same worker on A, in the same run and cluster.
``workload.py`` runs it (its docstring says how); the table is here. docs/guides/verl.md has the figures."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Metric, Report, Suite, Table


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (default 16, 1+)")
    p.add_argument("--n", type=int, default=4, help="responses per prompt (default 4, 1+)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per worker and rep (default 5, 1+)")


def _run(ctx: Context) -> Report:
    from .workload import run, step_mib

    a = ctx.args
    if min(a.prompts, a.n, a.steps) < 1:
        raise BenchArgumentError("--prompts, --n and --steps must be at least 1")
    results = run(ctx.work, a.prompts, a.n, a.steps, ctx.reps, ctx.seed, ctx.say)
    ms = Metric("ms", higher_is_better=False)
    table = Table("A step on the TransferQueue layer: the worker's calls", ("call", "worker"), (ms,), ("one node",))
    for call, part in (("put + get", (1, 1)), ("kv_batch_put", (1, 0)), ("kv_batch_get", (0, 1))):
        for label, times in results.items():
            table.add(call, label, group=call, ms=[(p * part[0] + g * part[1]) * 1e3 for p, g in times])
    shape = f"a step: {a.prompts * a.n} trajectories, {step_mib(a.prompts, a.n, ctx.seed):.1f} MiB of tensors"
    return Report("python -m bench verl-nodes: the TransferQueue layer on two Ray nodes vs one", [table], [shape])


SUITE = Suite(
    name="verl-nodes",
    help="the TransferQueue layer on two Ray nodes against one (a rep: --steps steps of each worker)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("torch", "tensordict", "ray"),
    work_prefix="pvn-",
)
