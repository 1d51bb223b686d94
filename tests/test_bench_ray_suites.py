"""A smoke run of the suites on a local Ray cluster of several raylets (ray, verl-nodes) at a tiny size through
``python -m bench`` in a subprocess: the rendered JSON holds each suite's rows and its same-run reference ratio.
Ray and verl's packages are installed by ``./dev test``; without them these are skipped."""

from __future__ import annotations

import pytest

from .bench_run import rows_in_groups, smoke


def test_ray() -> None:
    pytest.importorskip("ray")
    data = smoke("ray", "--small-batches", "1", "--large-batches", "0")
    rows = rows_in_groups(data["tables"][0], "path")
    assert len(rows) == 4  # 4 paths x the 6 MiB batches
    assert rows["6 MiB / persisting cross-node (A -> B)"]["vs"]["ray.put on A, ray.get on B"] > 0


def test_verl_nodes() -> None:
    pytest.importorskip("ray")
    pytest.importorskip("tensordict")
    data = smoke("verl-nodes", "--steps", "1", "--prompts", "2", "--n", "2")
    rows = rows_in_groups(data["tables"][0], "worker")
    assert rows["put + get / two nodes"]["vs"]["one node"] > 0 and len(rows) == 6
