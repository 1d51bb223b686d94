"""The chaos suite (``python -m bench chaos``) at a small count, run as a user runs it: a few SIGKILLs of
producers, consumers and the broker and a few hundred fuzzed frames must lose, duplicate and leak nothing, and the
command exits 0 (it exits 1, naming the figures, when one that must be 0 is not). This is also the suite's smoke
test. ``PERSISTING_CHAOS_TRIALS`` and ``PERSISTING_CHAOS_FRAMES`` scale it; docs/benchmarks/chaos.md has a run at
100 trials and 10,000 frames. The tensor scenario (kill -9 of the broker under 6 MiB batches while compacting) runs
apart, at ``PERSISTING_CHAOS_TENSOR_KILLS`` kills (10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.chaos.tensor_kills import MUST_BE_ZERO

TRIALS = int(os.environ.get("PERSISTING_CHAOS_TRIALS", "2"))
FRAMES = int(os.environ.get("PERSISTING_CHAOS_FRAMES", "200"))
ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600


def test_kill_9_everywhere_loses_duplicates_and_leaks_nothing(seed: int) -> None:
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"pch-t{os.getpid()}"  # short: ipc paths are limited
    base.mkdir()
    args = ["chaos", "--only", "clients", "--trials", str(TRIALS), "--frames", str(FRAMES), "--seed", str(seed)]
    args += ["--dir", str(base)]
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


TENSOR_KILLS = int(os.environ.get("PERSISTING_CHAOS_TENSOR_KILLS", "10"))


def test_kill_9_of_the_broker_under_tensor_batches_while_compacting(seed: int) -> None:
    """Issue 37 (6): the chaos suite's tensor scenario, short: ``TENSOR_KILLS`` SIGKILLs of a broker (8 MiB arena) at
    seeded moments under two producers of 6 MiB and 768 KiB batches and a consumer, its bucket compacting
    (``compact_min_fragments = 2``): every restart gets ready and opens the topic, every acknowledged sample is
    stored once with its bytes, and neither shared memory nor kept payloads are left (docs/benchmarks/chaos.md has
    the long run)."""
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"pch-k{os.getpid()}"
    base.mkdir()
    args = ["chaos", "--only", "tensors", "--tensor-kills", str(TENSOR_KILLS), "--seed", str(seed), "--dir", str(base)]
    cmd = [sys.executable, "-m", "bench", *args, "--no-progress", "--format", "json"]
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert not list(base.iterdir())  # the run's folder removed
    finally:
        base.rmdir()
    data = json.loads(out.stdout) if out.stdout.strip() else {}
    result = data.get("tensors", {})
    print(result)
    assert out.returncode == 0, f"seed {seed}: exit {out.returncode}: {data.get('failed')} {out.stderr[-3000:]}"
    assert result["broker kill -9 + restart"] == TENSOR_KILLS and result["samples acknowledged"] > 0, result
    for figure in MUST_BE_ZERO:
        assert result[figure] == 0, f"seed {seed}: {figure} = {result[figure]} ({result})"
    assert result["compactions seen (Lance Rewrite commits)"] > 0, f"seed {seed}: nothing compacted ({result})"
    assert data["failed"] == []
