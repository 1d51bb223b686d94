"""The ``multimodal`` suite (issue 24): multimodal payloads, one report of several parts side by side.

Parts (``--parts``, default all three): ``grpo`` (grpo.py and grpo_workers.py: a GRPO step of 8 prompts x 8
responses with a 24 MiB image per prompt, handed to 3 consumer tasks: bytes stored and peak RSS with dedup vs
without, time vs torch.multiprocessing.Queue and TransferQueue), ``big`` (big.py: one batch 8x the arena, vs
memcpy) and ``stream`` (stream.py: a sustained stream into Lance vs a plain file write, and the memory it takes).
Each part runs ``--reps`` repetitions under its own folder of the run's; ``options.py`` holds every part's flags,
``report.py`` the tables. docs/benchmarks/multimodal.md and multimodal-big.md have the figures."""

from __future__ import annotations

import argparse

from bench.harness import BenchArgumentError, Context, Report, Suite


def _arguments(p: argparse.ArgumentParser) -> None:
    from .options import add_args

    add_args(p)


def _run(ctx: Context) -> Report:
    from . import report
    from .options import parts

    try:
        wanted = parts(ctx.args)
    except ValueError as exc:
        raise BenchArgumentError(str(exc)) from exc
    out = Report("python -m bench multimodal: multimodal payloads")
    for name in wanted:
        ctx.say(f"part {name}")
        base = ctx.work / name
        base.mkdir()
        if name == "grpo":
            from .grpo import run as grpo

            tables, notes = report.grpo_tables(grpo(ctx.args, base))
        elif name == "big":
            from .big import run as big

            tables, notes = report.big_tables(big(ctx.args, base, ctx.reps))
        else:
            from .stream import run as stream

            tables, notes = report.stream_tables(stream(ctx.args, base, ctx.reps))
        out.tables += tables
        out.notes += notes
    return out


SUITE = Suite(
    name="multimodal",
    help="multimodal batches: a GRPO step with dedup, a batch far beyond the arena, a stream into Lance (a rep: "
    "each part's cases once)",
    run=_run,
    arguments=_arguments,
    reps=3,
    packages=("torch", "tensordict", "transferqueue", "ray"),
    work_prefix="pmm-",
)
