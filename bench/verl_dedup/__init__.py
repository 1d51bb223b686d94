"""The ``verl-dedup`` suite: the TransferQueue layer's dedup (``persisting.dedup``) on a verl GRPO step, on
(``auto``) and off, multimodal and text-only, each run in a fresh process with a broker of its own. ``workload.py``
runs one (its docstring says the step); the tables are here. docs/guides/verl.md has the figures."""

from __future__ import annotations

import argparse
from typing import Any

from bench.common.fresh_process import run_json
from bench.harness import BenchArgumentError, Context, Metric, Report, Suite, Table

MiB = 1 << 20


def _arguments(p: argparse.ArgumentParser) -> None:
    from .workload import SHAPES, add_workload_args

    add_workload_args(p)
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)} (default both)")


def _run(ctx: Context) -> Report:
    from .workload import MODES, SHAPES, workload_argv

    a = ctx.args
    if min(a.prompts, a.n, a.steps, a.arena_mib) < 1 or a.image_mib <= 0:
        raise BenchArgumentError("--prompts, --n, --steps and --arena-mib must be at least 1, --image-mib above 0")
    shapes = [x.strip() for x in a.shapes.split(",") if x.strip()]
    if not shapes or not set(shapes) <= set(SHAPES):
        raise BenchArgumentError(f"--shapes must name some of {', '.join(SHAPES)}, got {a.shapes!r}")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rep in range(ctx.reps):
        for shape in (s for s in SHAPES if s in shapes):
            for mode in MODES:  # alternating: a slow spell of the machine hits every row
                ctx.say(f"run {rep + 1} of {ctx.reps}: {shape}, dedup {mode}")
                # no --dir: the run works in its own folder in /tmp (its broker's socket path must stay short)
                argv = [shape, mode, *workload_argv(a)]
                runs.setdefault((shape, mode), []).append(run_json("bench.verl_dedup.workload", argv, shape))
    return _report(runs, a)


def _report(runs: dict[tuple[str, str], list[dict[str, Any]]], a: argparse.Namespace) -> Report:
    labels = ("shape", "dedup")
    step = Table("put + get per step (each run: the median of its steps)", labels,
                 (Metric("ms", higher_is_better=False),), ("off",), runs=True)  # fmt: skip
    disk = Table(
        "Bytes: the storage folder after the run; the deduped fields put and stored (the broker's counters)",
        labels,
        (Metric("on disk MiB", False, 4), Metric("deduped put MiB", False, 4), Metric("stored MiB", False, 4)),
        ("off",),
    )
    for (shape, mode), rs in runs.items():
        step.add(shape, mode, group=shape, ms=[r["step_s"] * 1e3 for r in rs])
        disk.add(
            shape,
            mode,
            group=shape,
            on_disk_MiB=[r["disk"] / MiB for r in rs],
            deduped_put_MiB=[r.get("put_bytes", 0) / MiB for r in rs],
            stored_MiB=[r.get("stored_bytes", 0) / MiB for r in rs],
        )
    shape = f"{a.prompts} prompts x n={a.n}, multimodal: {a.image_mib} MiB pixel_values per prompt, {a.steps} steps"
    return Report("python -m bench verl-dedup: the layer's dedup on a GRPO step, on vs off", [step, disk], [shape],
                  data={"runs": [{"shape": s, "dedup": m, "runs": rs} for (s, m), rs in runs.items()]})  # fmt: skip


SUITE = Suite(
    name="verl-dedup",
    help="the TransferQueue layer's dedup on a GRPO step, on and off (a rep: one fresh-process run of each shape "
    "and mode)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("torch", "tensordict"),
    work_prefix="pvd-",
)
