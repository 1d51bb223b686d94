"""A smoke run of each suite of bench/'s second half (pq, storage, ray, verl, verl-nodes, verl-dedup,
multimodal, lance-read-apis, lance-read-cpu, lance-encoding, wal-rounds) and of the dedup-lifetime probe at a tiny
size (chaos's is tests/test_chaos.py), through ``python -m bench`` in a subprocess (they spawn workers and brokers): the rendered JSON holds each
suite's rows and, where it has one, its same-run reference ratio. Ray, verl and TransferQueue are installed by
``./dev test``; without them the suites that need them are skipped."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE_TIMEOUT_S = 300


def _bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    """``python -m bench ARGS --reps 1 --no-progress --dir tmp --format json``, its output parsed."""
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "bench", *args, "--no-progress", "--dir", str(work), "--format", "json"]
    cmd += [] if "--reps" in args else ["--reps", "1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not list(work.iterdir())  # the run's folder removed
    data: dict[str, Any] = json.loads(out.stdout)
    assert data["meta"]["command"].endswith(shlex.join(cmd[3:])) and "persisting revision" in data["meta"]
    return data


def _rows(table: dict[str, Any], column: str) -> dict[str, dict[str, Any]]:
    """The rows of ``table`` by the label ``column`` (and group, where rows share a label)."""
    return {" / ".join(filter(None, (r["group"], r["labels"][column]))): r for r in table["rows"]}


def test_pq(tmp_path: Path) -> None:
    pytest.importorskip("persistqueue")
    data = _bench(tmp_path, "pq", "--n", "20", "--mp-n", "20", "--mp-repeat", "1")
    items, floor, wall, phases = data["tables"]
    rows = _rows(items, "library")
    assert len(rows) == 15  # 5 classes x persist-queue and the two durabilities
    assert set(rows["SQLiteAckQueue / persisting durability=sync"]["vs"]) == {"persist-queue"}
    assert rows["SQLiteAckQueue / persisting durability=sync"]["value"]["per item us"] > 0
    assert len(floor["rows"]) == 2
    ours = _rows(wall, "library")["persisting"]
    assert ours["vs"]["persist-queue"] > 0 and ours["cells"]["lost"] == "0" and ours["cells"]["twice"] == "0"
    assert len(phases["rows"]) == 10


def test_storage(tmp_path: Path) -> None:
    pytest.importorskip("moto")
    data = _bench(tmp_path, "storage", "--records", "100", "--tensors", "2", "--tensor-kib", "4")
    for table in data["tables"]:  # flush, read
        rows = _rows(table, "store")
        s3 = [r for name, r in rows.items() if "S3" in name]
        assert len(rows) == 4 and len(s3) == 2
        assert all(set(r["vs"]) == {"local disk"} and r["vs"]["local disk"] > 0 for r in s3)


def test_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    data = _bench(tmp_path, "ray", "--small-batches", "1", "--large-batches", "1")
    rows = _rows(data["tables"][0], "path")
    assert len(rows) == 8  # 4 paths x 2 batch sizes
    assert rows["6 MiB / persisting cross-node (A -> B)"]["vs"]["ray.put on A, ray.get on B"] > 0


def test_verl(tmp_path: Path) -> None:
    """The persisting backend only: TransferQueue's Ray cluster would add a minute (the ratio's own arithmetic is
    the harness's, tested in tests/test_bench_suites.py)."""
    pytest.importorskip("tensordict")
    data = _bench(tmp_path, "verl", "--only", "persisting", "--steps", "1", "--prompts", "2", "--n", "2")
    steps, rss = data["tables"]
    assert set(_rows(steps, "backend")) == {
        f"{p} / persisting" for p in ("time per step", "rollout puts", "trainer's part")
    }
    assert "all processes / persisting" in _rows(rss, "backend")


def test_verl_nodes(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("tensordict")
    data = _bench(tmp_path, "verl-nodes", "--steps", "1", "--prompts", "2", "--n", "2")
    rows = _rows(data["tables"][0], "worker")
    assert rows["put + get / two nodes"]["vs"]["one node"] > 0 and len(rows) == 6


def test_verl_dedup(tmp_path: Path) -> None:
    pytest.importorskip("tensordict")
    args = ["--steps", "1", "--prompts", "2", "--n", "2", "--image-mib", "0.25", "--shapes", "multimodal"]
    data = _bench(tmp_path, "verl-dedup", *args)
    step, disk = data["tables"]
    assert _rows(step, "dedup")["multimodal / auto"]["vs"]["off"] > 0
    deduped = _rows(disk, "dedup")["multimodal / auto"]
    assert deduped["vs"]["off"] > 1  # each image stored once of its n=2 copies
    assert deduped["value"]["stored MiB"] < deduped["value"]["deduped put MiB"]


def test_multimodal(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["multimodal", "--grpo-prompts", "2", "--grpo-responses", "2", "--grpo-image-mib", "1"]
    args += ["--grpo-cases", "persisting dedup,persisting", "--big-gib", "0.0625", "--big-arena-mib", "32"]
    args += ["--stream-arena-mib", "32", "--stream-factor", "1", "--memory-factor", "1", "--encoders", "1"]
    data = _bench(tmp_path, *args)
    step, hashes, big, big_rss, stream, memory, _speed = data["tables"]
    assert _rows(step, "system")["persisting dedup"]["vs"]["persisting"] > 0
    assert set(_rows(hashes, "what")["memcpy"]["value"]) == {"GB/s"}
    assert _rows(big, "what")["put -> consumer holds it all"]["vs"]["memcpy"] > 0
    assert len(big_rss["rows"]) == 2 and len(memory["rows"]) == 4
    assert _rows(stream, "what")["1 / persisting"]["vs"]["file write + fdatasync"] > 0
    assert "big: every byte checked: exact" in data["notes"]


def test_lance_read_apis(tmp_path: Path) -> None:
    data = _bench(tmp_path, "lance-read-apis", "--gib", "0.0625")
    rows = _rows(data["tables"][0], "read")
    assert len(rows) == 5 and rows["LanceFragment.to_batches"]["vs"]["plain read of the data files"] > 0


def test_lance_read_cpu(tmp_path: Path) -> None:
    data = _bench(tmp_path, "lance-read-cpu", "--gib", "0.0625", "--arena-mib", "16")
    cpu, speed = data["tables"]
    assert set(_rows(cpu, "figure")) == {"broker", "consumer", "total"}
    assert speed["rows"][0]["value"]["GB/s"] > 0


def test_lance_encoding(tmp_path: Path) -> None:
    data = _bench(tmp_path, "lance-encoding", "--mib", "1")
    writes, typed, pieces = data["tables"]
    assert len(writes["rows"]) == 24 and len(typed["rows"]) == 4 and len(pieces["rows"]) == 3
    assert {r["labels"]["keeps it"] for r in typed["rows"] if r["labels"]["format"] == "stable"} == {"yes"}


def test_wal_rounds(tmp_path: Path) -> None:
    data = _bench(tmp_path, "wal-rounds", "--commits", "20")
    rows = data["tables"][0]["rows"]
    assert len(rows) == 8
    ratios = [r["vs"]["asyncio.to_thread at 5 ms"] for r in rows if r["vs"]]
    assert len(ratios) == 6 and all(x > 0 for x in ratios)  # the two reference rows have none


def test_dedup_lifetime_probe() -> None:
    args = ["dedup-lifetime", "--steps", "2", "--open-samples", "256", "--open-repeats", "1", "--reps", "1"]
    out = subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["put", "clear", "open"] and all("ratio" in x for x in lines)
