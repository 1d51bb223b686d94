"""tensordict.TensorDict in put and out of get_data/get_batch, embedded and through a real broker (zero-copy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")

from persisting import InvalidRecordError, SyncQueue  # noqa: E402

from .broker_fixture import BrokerProcess, in_arena_mapping  # noqa: E402

TensorDict = tensordict.TensorDict


def _rollout(seed: int, n: int = 12) -> Any:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "input_ids": torch.randint(0, 50_000, (n, 16), generator=g),
            "logprobs": torch.randn(n, 16, generator=g).to(torch.bfloat16),
            "mask": torch.rand(n, 16, generator=g) > 0.5,
            "reward": torch.randn(n, generator=g, dtype=torch.float64),
            "obs": {"pixels": torch.randint(0, 255, (n, 3, 4, 4), generator=g, dtype=torch.uint8)},
        },
        batch_size=[n],
    )


def _assert_same(got: Any, want: Any) -> None:
    assert isinstance(got, TensorDict)
    assert got.batch_size == want.batch_size
    keys = sorted(want.keys(include_nested=True, leaves_only=True), key=str)
    assert sorted(got.keys(include_nested=True, leaves_only=True), key=str) == keys
    for key in keys:
        a, b = got.get(key), want.get(key)
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(a, b), key


def test_a_tensordict_round_trips_exactly_embedded(store: Path, seed: int) -> None:
    td = _rollout(seed)
    with SyncQueue("td", storage_path=store) as q:
        meta = q.put(td, partition_id="step-1")
        assert meta.size == 12 and "obs.pixels" in meta.field_names
        got = q.get_data(meta, as_tensordict=True)
        _assert_same(got, td)
        plain = q.get_data(meta)  # without asking: the usual dict of fields
        assert isinstance(plain, dict) and "obs.pixels" in plain
        data, taken = q.get_batch(
            ["input_ids", "obs.pixels"], batch_size=5, task_name="t", partition_id="step-1", as_tensordict=True
        )
        assert taken.size == 5 and data.batch_size == torch.Size([5])
        assert torch.equal(data["obs", "pixels"], td["obs", "pixels"][:5])
    with SyncQueue("td", storage_path=store, as_tensordict=True) as q:  # the Queue option, after a reopen
        _assert_same(q.get_data(meta), td)


def test_non_tensor_entries_and_bad_tensordicts(store: Path) -> None:
    td = TensorDict({"x": torch.arange(3), "prompt": ["a", "b", "c"]}, batch_size=[3])
    with SyncQueue("td2", storage_path=store) as q:
        meta = q.put(td, partition_id="p")
        got = q.get_data(meta, as_tensordict=True)
        assert torch.equal(got["x"], td["x"]) and list(got["prompt"]) == ["a", "b", "c"]
        with pytest.raises(InvalidRecordError, match=r"holds '\.'"):
            q.put(TensorDict({"a.b": torch.zeros(2)}, batch_size=[2]), partition_id="p")
        with pytest.raises(InvalidRecordError, match="batch dimension"):
            q.put(TensorDict({"a": torch.zeros(2)}, batch_size=[]), partition_id="p")
        empty = q.get_data(q.get_meta(batch_size=0, task_name="t", partition_id="p"), as_tensordict=True)
        assert isinstance(empty, TensorDict) and empty.batch_size == torch.Size([0])


@pytest.mark.slow
def test_a_tensordict_round_trips_exactly_through_the_broker_as_arena_views(broker: BrokerProcess, seed: int) -> None:
    td = _rollout(seed, n=32)
    with SyncQueue("td", broker=broker.address, as_tensordict=True) as q:
        meta = q.put(td, partition_id="step-1")
        got = q.get_data(meta)
        _assert_same(got, td)
        for key in got.keys(include_nested=True, leaves_only=True):
            assert in_arena_mapping(got.get(key).data_ptr()), key  # views on the arena: no copy
        data, _taken = q.get_batch(list(meta.field_names), batch_size=32, task_name="train", partition_id="step-1")
        _assert_same(data, td)
        assert in_arena_mapping(data["obs", "pixels"].data_ptr())
        assert q.stats()["zerocopy"]["get_copied_bytes"] == 0
