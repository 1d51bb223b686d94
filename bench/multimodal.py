"""``python -m bench multimodal``: multimodal payloads (issue 24), one report of several parts side by side.

Parts (``--parts``, default all three): ``grpo`` (multimodal_grpo.py: a GRPO step of 8 prompts x 8 responses with
a 24 MiB image per prompt, handed to 3 consumer tasks: bytes stored and peak RSS with dedup vs without, time vs
torch.multiprocessing.Queue and TransferQueue), ``big`` (multimodal_big.py) and ``stream``
(multimodal_stream.py). A part whose module is not there is named in the report as not measured.

The contract of a part module ``bench/multimodal_<part>.py``:

- ``add_args(parser)``: its own options (names prefixed by the part, e.g. ``--grpo-prompts``);
- ``run(args, base: Path) -> list[dict]``: runs ``args.reps`` repetitions (every figure of one repetition measured
  in the same run as its reference), working under the fresh folder ``base``; one dict per case and repetition;
- ``render(rows) -> str``: a markdown section (a ``###`` heading, medians over the repetitions, ratios).
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

PARTS = ("grpo", "big", "stream")


def _part(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f".multimodal_{name}", __package__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.multimodal_{name}":
            raise
        return None


def _parser(modules: dict[str, ModuleType | None]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench multimodal", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--reps", type=int, default=3, help="repetitions; the report gives medians")
    p.add_argument("--base", type=Path, default=None, help="working folder (default: a fresh temporary one)")
    p.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    for module in modules.values():
        if module is not None:
            module.add_args(p)
    return p


def _revision() -> str:
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def main(argv: list[str]) -> int:
    modules = {name: _part(name) for name in PARTS}
    args = _parser(modules).parse_args(argv)
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PARTS]
    if unknown or args.reps < 1:
        print(f"unknown part(s) {unknown} (known: {PARTS}) or --reps < 1", file=sys.stderr)
        return 2
    revision = _revision()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    sections = []
    for name in wanted:
        module = modules[name]
        if module is None:
            sections.append(f"### {name}\n\nnot measured: bench/multimodal_{name}.py is not there in this revision")
            continue
        with tempfile.TemporaryDirectory(prefix=f"mm-{name}-", dir=args.base) as tmp:
            rows = module.run(args, Path(tmp))
        sections.append(module.render(rows))
    command = shlex.join(["python", "-m", "bench", "multimodal", *argv])
    head = f"## python -m bench multimodal\n\n`{command.strip()}` at {revision}, {started}, median of {args.reps}"
    report = "\n\n".join([head, *sections])
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0
