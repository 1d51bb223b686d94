"""A smoke run of the suites on a local Ray cluster (ray, verl-nodes) and of verl (its rollout workers and a
broker: as long), at a tiny size through ``python -m bench`` in a subprocess: the rendered JSON holds each suite's
rows and its same-run reference ratio. Ray, verl's packages and TransferQueue are installed by ``./dev test``;
without them these are skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from .bench_run import rows_in_groups, smoke


def test_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    data = smoke(tmp_path, "ray", "--small-batches", "1", "--large-batches", "1")
    rows = rows_in_groups(data["tables"][0], "path")
    assert len(rows) == 8  # 4 paths x 2 batch sizes
    assert rows["6 MiB / persisting cross-node (A -> B)"]["vs"]["ray.put on A, ray.get on B"] > 0


def test_verl(tmp_path: Path) -> None:
    """Both backends, one rollout worker each (TransferQueue's own Ray cluster is most of the time)."""
    pytest.importorskip("tensordict")
    args = ["--workers", "1", "--steps", "1", "--prompts", "2", "--n", "2", "--dp", "1"]
    data = smoke(tmp_path, "verl", *args)
    steps, rss = data["tables"]
    rows = rows_in_groups(steps, "backend")
    missing = any(note.startswith("TransferQueue not measured") for note in data["notes"])
    backends = {"persisting"} if missing else {"persisting", "transferqueue"}
    assert set(rows) == {f"{p} / {b}" for p in ("time per step", "rollout puts", "trainer's part") for b in backends}
    if "transferqueue" in backends:
        assert rows["time per step / persisting"]["vs"]["transferqueue"] > 0
    assert "all processes / persisting" in rows_in_groups(rss, "backend")


def test_verl_nodes(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("tensordict")
    data = smoke(tmp_path, "verl-nodes", "--steps", "1", "--prompts", "2", "--n", "2")
    rows = rows_in_groups(data["tables"][0], "worker")
    assert rows["put + get / two nodes"]["vs"]["one node"] > 0 and len(rows) == 6
