"""The ``verl`` suite: one verl-shaped training step through persisting's TransferQueue layer and through
TransferQueue 0.1.11 (the ``transferqueue`` extra), in the same run.

A step, as verl 0.9.1's v1 trainer and agent loop make it: the trainer puts the step's prompts (``kv_batch_put``,
tag ``pending``); ``--workers`` rollout processes set each prompt ``running`` (``kv_put``), ``kv_batch_put`` their
trajectories (``--prompts`` prompts x ``--n`` responses in all: bench/common/verl_steps.py) and set each prompt
``finished``; the trainer lists the partition (``kv_list``), then per data-parallel rank (``--dp``)
``kv_batch_get``s its share of the token columns, writes ``old_log_probs``, ``ref_log_prob`` and ``values`` back
column by column (``kv_batch_put``), reads what the update needs, and ``kv_clear``s the step's keys. Time per step
is from the rollouts' first put to the clear; each backend runs ``--steps`` steps after one warm-up, ``--reps``
times in fresh processes (alternating backends: bench/verl/one.py), medians by the harness. Peak resident memory
(VmHWM from /proc, shared pages a process touched included) is read for every process of the run before it ends:
the trainer, each rollout worker, and the data plane (persisting: the broker; TransferQueue: its controller and
storage actors, and Ray's own processes). ``step.py`` is the step's pieces, ``report.py`` the tables."""

from __future__ import annotations

import argparse

from bench.common.fresh_process import run_json
from bench.common.tq_cluster import tq_missing
from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    from .one import BACKENDS, add_workload_args

    add_workload_args(p)
    p.add_argument("--only", choices=BACKENDS, help="run one backend only")


def _run(ctx: Context) -> Report:
    from .one import workload_argv
    from .report import verl_report

    a = ctx.args
    if min(a.workers, a.prompts, a.n, a.dp, a.steps, a.arena_mib) < 1 or a.prompts % a.workers:
        raise BenchArgumentError("--workers, --prompts, --n, --dp, --steps, --arena-mib: 1+; --prompts a multiple "
                                 "of --workers")  # fmt: skip
    backends, notes = _backends(a.only)
    runs: dict[str, list[dict[str, object]]] = {b: [] for b in backends}
    for rep in range(ctx.reps):
        for backend in backends:  # alternating: a slow spell of the machine hits both
            ctx.say(f"run {rep + 1} of {ctx.reps}: {backend}")
            # no --dir: the run works in its own folder in /tmp (its broker's socket path must stay short)
            argv = [backend, *workload_argv(a)]
            runs[backend].append(run_json("bench.verl.one", argv, f"the {backend} run"))
    return verl_report(runs, a, notes)


def _backends(only: str | None) -> tuple[list[str], list[str]]:
    """The backends to run, and a note when TransferQueue is missing."""

    backends = [only] if only else ["persisting", "transferqueue"]
    missing = tq_missing() if "transferqueue" in backends else None
    if missing:
        backends.remove("transferqueue")
        return backends, [f"TransferQueue not measured: {missing}"]
    return backends, []


SUITE = Suite(
    name="verl",
    help="a verl-shaped step through persisting's TransferQueue layer vs TransferQueue (a rep: one run of each "
    "backend in a fresh process)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("torch", "tensordict", "transferqueue", "ray"),
    work_prefix="pvb-",
)
