"""Python objects in tensor batches: NonTensorStack/NonTensorData of a TensorDict and per-sample lists, exact
round trips embedded and through a real broker, pickle only with objects="pickle" and only in clients."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")

from persisting import ConfigError, InvalidRecordError, SyncQueue  # noqa: E402

from .broker_fixture import BrokerProcess  # noqa: E402

TensorDict = tensordict.TensorDict
NonTensorData = tensordict.NonTensorData
NonTensorStack = tensordict.NonTensorStack


@dataclasses.dataclass
class Extra:
    """An object the record codec cannot store (verl's extra_fields may hold such)."""

    turns: int
    tools: set[str]


class Marker:
    """Unpickling it creates a file: it shows in which process a pickle was loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (Path(self.path),))


def _stack(values: list[Any]) -> Any:
    return NonTensorStack(*(NonTensorData(v) for v in values))


def _trajectories(n: int = 4) -> Any:
    g = torch.Generator().manual_seed(n)
    lengths = [3, 7, 1, 5, 2, 9][:n]
    messages = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a" * i}] for i in range(n)]
    mm_inputs = [{"pixel_values": torch.randn(i + 1, 8, generator=g), "image_grid_thw": (1, i, 2)} for i in range(n)]
    return TensorDict(
        {
            "responses": torch.nested.nested_tensor([torch.arange(k) for k in lengths], layout=torch.jagged),
            "raw_prompt": _stack(messages),
            "multi_modal_inputs": _stack(mm_inputs),
            "extra_fields": _stack([Extra(i, {"search"}) for i in range(n)]),
            "uid": _stack([f"uid-{i // 2}" for i in range(n)]),
        },
        batch_size=[n],
    )


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _assert_same(got: Any, want: Any) -> None:
    assert isinstance(got, TensorDict) and got.batch_size == want.batch_size
    assert sorted(got.keys()) == sorted(want.keys())
    for key in want.keys():  # noqa: SIM118 (a TensorDict)
        a, b = got.get(key), want.get(key)
        if getattr(b, "is_nested", False):
            assert [t.tolist() for t in a.unbind()] == [t.tolist() for t in b.unbind()]
            continue
        assert isinstance(a, NonTensorStack), key
        assert _equal(a.tolist(), b.tolist()), key


@pytest.fixture(params=["embedded", "broker"])
def queue_kw(request: pytest.FixtureRequest, store: Path) -> Iterator[dict[str, Any]]:
    if request.param == "embedded":
        yield {"storage_path": store}
    else:
        yield {"broker": request.getfixturevalue("broker").address}


def test_a_verl_shaped_tensordict_with_objects_round_trips_exactly(queue_kw: dict[str, Any]) -> None:
    td = _trajectories()
    with SyncQueue("objs", objects="pickle", **queue_kw) as q:
        meta = q.put(td, partition_id="step-1")
        assert q.stats()["fields"]["extra_fields"] == "object" and q.stats()["fields"]["uid"] == "object"
        _assert_same(q.get_data(meta, as_tensordict=True), td)
        plain = q.get_data(meta.select_samples([2, 0]))
        assert _equal(plain["raw_prompt"], [td["raw_prompt"][2], td["raw_prompt"][0]])
        q.flush()
    with SyncQueue("objs", objects="pickle", as_tensordict=True, **queue_kw) as q:  # after a reopen
        _assert_same(q.get_data(meta), td)
        data, taken = q.get_batch(["uid", "multi_modal_inputs"], batch_size=3, task_name="t", partition_id="step-1")
        assert taken.size == 3 and _equal(list(data["multi_modal_inputs"]), td["multi_modal_inputs"][:3])
        assert q.get(limit=1)[0]["extra_fields"] == Extra(0, {"search"})  # records see the objects too
    with SyncQueue("objs", **queue_kw) as q:  # no opt-in: nothing is unpickled
        with pytest.raises(ConfigError, match="objects='pickle'"):
            q.get_data(meta)
        with pytest.raises(ConfigError, match="objects='pickle'"):
            q.get(limit=1)


def test_without_pickle_the_codec_stores_dicts_holding_tensors_exactly(queue_kw: dict[str, Any]) -> None:
    td = _trajectories()
    del td["extra_fields"]  # the one entry that needs pickle
    with SyncQueue("codec", **queue_kw) as q:
        meta = q.put(td, partition_id="p")
        assert q.stats()["fields"]["multi_modal_inputs"] == "nested"  # msgpack, no pickle
        _assert_same(q.get_data(meta, as_tensordict=True), td)
        per_sample = [{"pixel_values": torch.ones(2, dtype=torch.bfloat16)}, {"nested": [(1, "a")]}]
        m2 = q.put({"x": torch.zeros(2), "info": per_sample}, partition_id="p")  # a plain list field
        assert _equal(q.get_data(m2)["info"], per_sample)
        with pytest.raises(InvalidRecordError, match="objects='pickle'"):
            q.put(_trajectories(), partition_id="p")
        with pytest.raises(ConfigError, match="objects must be"):
            SyncQueue("codec", objects="json", **queue_kw)


def test_plain_list_fields_are_pickled_only_where_the_codec_cannot_store_them(store: Path) -> None:
    with SyncQueue("lists", storage_path=store, objects="pickle") as q:
        meta = q.put({"x": torch.zeros(2), "text": ["a", "b"], "obj": [Extra(1, set()), None]}, partition_id="p")
        kinds = {name: f.kind for name, f in meta.samples[0].fields.items()}
        assert kinds == {"x": "tensor", "text": "value", "obj": "value"}
        assert q.stats()["fields"]["text"] == "str" and q.stats()["fields"]["obj"] == "object"
        assert q.get_data(meta)["obj"] == [Extra(1, set()), None]
        # once a field holds pickles, later values of it are pickled too (one kind per field)
        more = q.put({"x": torch.zeros(1), "obj": ["plain"]}, partition_id="p")
        assert q.get_data(more)["obj"] == ["plain"]


@pytest.mark.slow
def test_the_broker_stores_pickles_without_loading_them(broker: BrokerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    td = TensorDict({"ids": torch.arange(2), "obj": _stack([Marker(str(marker)), 1])}, batch_size=[2])
    with SyncQueue("trust", broker=broker.address, objects="pickle") as q:
        meta = q.put(td, partition_id="p")
        q.flush()
        broker.kill()  # a restart replays the log and re-adopts the arena: still nothing loaded
        broker.start()
        q.flush()
        assert not marker.exists()  # neither put, flush, replay nor restart ran the pickle's code
        data = q.get_data(meta)  # the client that opted in loads it
        assert marker.exists() and data["obj"][1] == 1


def test_an_unpicklable_value_is_refused_naming_the_field(store: Path) -> None:
    with SyncQueue("unpicklable", storage_path=store, objects="pickle") as q:
        with pytest.raises(InvalidRecordError, match=r"'fn'.*cannot be pickled"):
            q.put({"x": torch.zeros(1), "fn": [lambda: 1]}, partition_id="p")
        assert len(q) == 0
    assert pickle.loads(pickle.dumps(Extra(1, {"a"}))) == Extra(1, {"a"})


def test_a_reservation_s_extra_values_are_pickled_like_a_put_s(store: Path) -> None:
    with SyncQueue("reserved", storage_path=store, objects="pickle") as q:
        with q.reserve({"x": ((2,), torch.float32)}, batch_size=2, partition_id="p") as r:
            r["x"].fill_(1.0)
            meta = q.put(r, extra={"obj": [Extra(1, {"a"}), Extra(2, set())]})
        assert q.get_data(meta)["obj"] == [Extra(1, {"a"}), Extra(2, set())]
