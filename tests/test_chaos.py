"""The chaos suite (``python -m bench chaos``) at a small count, run as a user runs it: a few SIGKILLs of
producers, consumers and the broker and a few hundred fuzzed frames must lose, duplicate and leak nothing, and the
command exits 0 (it exits 1, naming the figures, when one that must be 0 is not). This is also the suite's smoke
test. ``PERSISTING_CHAOS_TRIALS`` and ``PERSISTING_CHAOS_FRAMES`` scale it; docs/benchmarks/chaos.md has a run at
100 trials and 10,000 frames."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TRIALS = int(os.environ.get("PERSISTING_CHAOS_TRIALS", "2"))
FRAMES = int(os.environ.get("PERSISTING_CHAOS_FRAMES", "200"))
ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600


def test_kill_9_everywhere_loses_duplicates_and_leaks_nothing(seed: int) -> None:
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"pch-t{os.getpid()}"  # short: ipc paths are limited
    base.mkdir()
    args = ["chaos", "--trials", str(TRIALS), "--frames", str(FRAMES), "--seed", str(seed), "--dir", str(base)]
    cmd = [sys.executable, "-m", "bench", *args, "--no-progress", "--format", "json"]
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert not list(base.iterdir())  # the run's folder removed
    finally:
        base.rmdir()
    assert out.returncode == 0, f"seed {seed}: exit {out.returncode}: {out.stderr[-3000:]}"
    data = json.loads(out.stdout)
    result = data["figures"]
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
    assert result["samples acknowledged to producers"] > 0 and result["producers killed"] == TRIALS
    assert data["failed"] == []
    table = {r["labels"]["figure"]: r["labels"]["value"] for r in data["tables"][0]["rows"]}
    assert table["acknowledged lost"] == "0" and table["duplicated"] == "0", table
