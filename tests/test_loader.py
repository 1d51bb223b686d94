"""The streaming data loader: a torch IterableDataset of (batch, meta) per dp_rank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from persisting import ConfigError, SyncQueue
from persisting.client.loader import StreamingDataset


def test_ranks_of_one_group_see_the_same_batches_and_groups_are_disjoint(store: Path) -> None:
    with SyncQueue("l", store) as q:
        q.put({"x": torch.arange(40).reshape(20, 2), "y": np.arange(20)}, partition_id="p")

        def dataset(rank: int) -> StreamingDataset:
            return StreamingDataset(
                "l", ["x", "y"], batch_size=5, partition_id="p", dp_rank=rank, timeout=0.2, storage_path=store
            )

        # two ranks of data-parallel group 0 (e.g. tensor-parallel peers) and one rank of group 1, interleaved
        a, b, c = iter(dataset(0)), iter(dataset(0)), iter(dataset(1))
        seen: dict[str, list[list[int]]] = {"a": [], "b": [], "c": []}
        for _ in range(2):
            for key, it in (("a", a), ("b", b), ("c", c)):
                batch, meta = next(it)
                assert isinstance(batch["x"], torch.Tensor) and batch["x"].shape == (5, 2)
                assert list(batch["y"]) == meta.global_indexes
                seen[key].append(meta.global_indexes)
        assert seen["a"] == seen["b"]
        flat_a = {i for m in seen["a"] for i in m}
        flat_c = {i for m in seen["c"] for i in m}
        assert not flat_a & flat_c and len(flat_a | flat_c) == 20
        assert next(c, None) is None  # nothing left: it stops after the timeout

        loader = torch.utils.data.DataLoader(dataset(2), batch_size=None)
        assert list(loader) == []  # everything was taken by the task already


def test_bad_fields(store: Path) -> None:
    with pytest.raises(ConfigError, match="fields"):
        StreamingDataset("l", "x", batch_size=2, storage_path=store)
