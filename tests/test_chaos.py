"""The chaos harness (``python -m bench chaos``) at a small count: a few SIGKILLs of producers, consumers and the
broker and a few hundred fuzzed frames must lose, duplicate and leak nothing. ``PERSISTING_CHAOS_TRIALS`` and
``PERSISTING_CHAOS_FRAMES`` scale it; docs/benchmarks/chaos.md has a run at 100 trials and 10,000 frames."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bench.chaos import workload as chaos

TRIALS = int(os.environ.get("PERSISTING_CHAOS_TRIALS", "2"))
FRAMES = int(os.environ.get("PERSISTING_CHAOS_FRAMES", "200"))


def test_kill_9_everywhere_loses_duplicates_and_leaks_nothing(seed: int) -> None:
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"pch-t{os.getpid()}"  # short: ipc paths are limited
    base.mkdir()
    try:
        result = chaos.run(base, TRIALS, FRAMES, seed)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(result)
    for figure in (
        "acknowledged lost",
        "duplicated",
        "tensor samples not consumed after the drain (broker's count)",
        "tensor samples still leased after the drain",
        "acknowledged tensor samples no consumer took",
        "workers that failed (exit code not 0)",
        "corrupt views seen by consumers",
        "arena bytes leaked (leased_bytes)",
        "arena leases left open",
        "frames without a reply",
        "tracebacks in the broker log",
        "workers that did not stop when asked",
    ):
        assert result[figure] == 0, f"seed {seed}: {figure} = {result[figure]} ({result})"
    assert result["this broker's arena file left"] is False  # (others' files in /dev/shm are not ours to count)
    assert result["broker alive after fuzz"] is True and result["broker clean stop exit code"] == 0
    assert result["samples acknowledged to producers"] > 0
