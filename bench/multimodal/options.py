"""The flags of ``python -m bench multimodal``: which parts run, and each part's own (prefixed by the part). Only
argparse here: ``python -m bench`` builds every suite's parser without importing a workload."""

from __future__ import annotations

import argparse

PARTS = ("grpo", "big", "stream")
GRPO_CASES = ("persisting dedup", "persisting", "torch.mp.Queue", "TransferQueue")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)} (default all)")
    grpo = p.add_argument_group("grpo: one GRPO multimodal step, producer -> 3 consumer tasks")
    grpo.add_argument("--grpo-prompts", type=int, default=8, help="prompts per step (default 8)")
    grpo.add_argument("--grpo-responses", type=int, default=8, help="responses per prompt (default 8)")
    grpo.add_argument("--grpo-image-mib", type=int, default=24, help="each prompt's image, MiB (default 24)")
    grpo.add_argument("--grpo-cases", default=",".join(GRPO_CASES), help=f"comma-separated, of {', '.join(GRPO_CASES)}")
    # The broker's default arena (256 MiB) for both: its shared memory grows within the default budget (issue 31);
    # until then these were 2048 and 512, sized to hold a step.
    grpo.add_argument("--grpo-arena-mib", type=int, default=256, help="the broker's first segment without dedup")
    grpo.add_argument("--grpo-dedup-arena-mib", type=int, default=256, help="the broker's first segment with dedup")
    big = p.add_argument_group("big: one batch far beyond the arena")
    big.add_argument("--big-gib", type=float, default=2.0, help="the batch, GiB (default 2)")
    big.add_argument("--big-arena-mib", type=int, default=256, help="the broker's arena, MiB (default 256)")
    big.add_argument(
        "--after-flush",
        action="store_true",
        help="the consumer asks only once the batch is flushed to Lance (its spool file gone): the read from Lance",
    )
    stream = p.add_argument_group("stream: a sustained stream into Lance, and the memory it takes")
    stream.add_argument("--stream-arena-mib", type=int, default=256, help="the broker's arena, MiB (default 256)")
    stream.add_argument("--stream-factor", type=int, default=4, help="persistence: stream this many arenas")
    stream.add_argument("--memory-factor", type=int, default=20, help="memory: stream this many arenas")
    stream.add_argument("--encoders", default=None, help="comma-separated encoder counts (default 1,2,all cores)")


def parts(args: argparse.Namespace) -> list[str]:
    """The parts asked for; ValueError naming an unknown one."""
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown or not wanted:
        raise ValueError(f"--parts: unknown {unknown} (known: {', '.join(PARTS)})")
    cases = [c.strip() for c in args.grpo_cases.split(",") if c.strip()]
    if "grpo" in wanted and (not cases or set(cases) - set(GRPO_CASES)):
        raise ValueError(f"--grpo-cases: of {', '.join(GRPO_CASES)}, got {args.grpo_cases!r}")
    return wanted
