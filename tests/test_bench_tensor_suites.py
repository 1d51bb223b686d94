"""Smoke runs of the bench suites that move tensors between processes (sizes, arena, jagged, multimodal) at a tiny
size, each checked for its rows and its reference ratios (a file of their own: ``./dev test`` gives whole files to
its workers, and these are among the slow ones)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from .bench_run import bench, bench_json, rows_by, rows_in_groups, smoke


def test_sizes_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["sizes", "--sizes", "1M,4M", "--reps", "1", "--stream-batches", "2", "--stream-bytes", "4M"]
    args += ["--hellos", "20", "--no-progress", "--dir", str(tmp_path / "work"), "--format", "json"]
    plot = importlib.util.find_spec("matplotlib") is not None
    if plot:
        args += ["--plot", str(tmp_path / "charts")]
    data = json.loads(bench(*args).stdout)
    one, stream, aims = data["tables"]
    for size in ("1 MiB", "4 MiB"):
        rows = {r["labels"]["system"]: r for r in one["rows"] if r["group"] == size}
        assert set(rows) == {"persisting", "torch.mp", "memcpy", "bound: 1 memcpy + 1 hello"}, rows
        assert rows["persisting"]["value"]["GB/s"] > 0
        assert set(rows["persisting"]["vs"]) == {"torch.mp", "memcpy"}
    assert {r["labels"]["system"] for r in stream["rows"]} == {"persisting", "torch.mp", "memcpy"}
    assert any(r["labels"]["aim"] == "1 MiB: persisting / torch.mp" for r in aims["rows"])
    assert "cpus" in data["meta"] and "persisting revision" in data["meta"]
    assert not any("run stopped" in n for n in data["notes"])
    assert not list((tmp_path / "work").iterdir())  # its work folder removed
    if plot:
        assert (tmp_path / "charts" / "sizes_gbps.png").stat().st_size > 0


def test_arena_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["arena", "--small-batches", "4", "--large-batches", "0", "--paced-batches", "0", "--beyond-batches", "0"]
    args += ["--no-transferqueue", "--arena-bytes", str(64 << 20), "--in-flight", "1", "--dir", str(tmp_path)]
    data = bench_json(*args)
    keys = {r["key"] for r in data["rows"]}
    assert {"memcpy-6MiB", "arena-6MiB-stream", "torch-6MiB-stream"} <= keys, keys
    table = data["tables"][0]
    stream = next(r for r in table["rows"] if r["cells"]["key"] == "arena-6MiB-stream")
    assert stream["vs"]["memcpy"] > 0 and stream["value"]["GB/s"] > 0 and stream["group"] == "6 MiB"


def test_jagged_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["jagged", "--samples", "4", "--min-len", "4", "--max-len", "16", "--batches", "1", "--reps", "1"]
    data = bench_json(*args, "--cases", "torch.mp padded", "--dir", str(tmp_path))  # and the reference
    rows = rows_by(data["tables"][0], "case")
    assert set(rows) == {"persisting jagged", "torch.mp padded"}
    assert rows["torch.mp padded"]["vs"]["persisting jagged"] > 0 and rows["persisting jagged"]["value"]["ms/batch"]


def test_multimodal() -> None:
    pytest.importorskip("torch")
    args = ["multimodal", "--grpo-prompts", "2", "--grpo-responses", "2", "--grpo-image-mib", "1"]
    args += ["--grpo-cases", "persisting dedup,persisting", "--big-gib", "0.0625", "--big-arena-mib", "32"]
    args += ["--stream-arena-mib", "32", "--stream-factor", "1", "--memory-factor", "1", "--encoders", "1"]
    data = smoke(*args)
    step, hashes, big, big_rss, stream, memory, _speed = data["tables"]
    assert rows_in_groups(step, "system")["persisting dedup"]["vs"]["persisting"] > 0
    assert set(rows_in_groups(hashes, "what")["memcpy"]["value"]) == {"GB/s"}
    assert rows_in_groups(big, "what")["put -> consumer holds it all"]["vs"]["memcpy"] > 0
    assert len(big_rss["rows"]) == 2 and len(memory["rows"]) == 4
    assert rows_in_groups(stream, "what")["1 / persisting"]["vs"]["file write + fdatasync"] > 0
    assert "big: every byte checked: exact" in data["notes"]
