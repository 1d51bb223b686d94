"""``python -m bench sizes`` at tiny sizes, as a user runs it: a row per size and system, the stream's rows, the aims
and the chart (docs/benchmarks/sizes.md has a full run)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_sizes_bench_prints_a_row_per_size_and_system(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cmd = [sys.executable, "-m", "bench", "sizes", "--sizes", "1M,4M", "--reps", "1", "--stream-batches", "2"]
    cmd += ["--stream-bytes", "4M", "--hellos", "50", "--no-progress", "--dir", str(tmp_path / "work")]
    plot = importlib.util.find_spec("matplotlib") is not None
    if plot:
        cmd += ["--plot", str(tmp_path / "charts")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()]
    for size in ("1 MiB", "4 MiB"):
        for system in ("persisting", "torch.mp", "memcpy", "bound:"):
            row = next((r for r in rows if r[:3] == [*size.split(), system]), None)
            assert row is not None, f"no {system} row at {size}:\n{out.stdout}"
            assert float(row[3]) > 0, row
    for system in ("persisting", "torch.mp"):
        assert any(r[:5] == ["2", "x", "4", "MiB", system] for r in rows), out.stdout
    assert "1 MiB: persisting / torch.mp" in out.stdout and "stream of 4 MiB batches" in out.stdout
    assert "run stopped" not in out.stdout
    assert not list((tmp_path / "work").iterdir())  # its work folder removed
    if plot:
        assert (tmp_path / "charts" / "sizes_gbps.png").stat().st_size > 0
