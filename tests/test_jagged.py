"""Jagged torch.nested tensors as fields of tensor batches: exact round trips embedded and through a real broker
(values as arena views), partial writes, sample selection, Lance readable without persisting, kill -9."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from persisting import ConfigError, InvalidRecordError, SchemaConflictError, SyncQueue  # noqa: E402
from persisting.errors import ProtocolError  # noqa: E402
from persisting.tensors import jagged  # noqa: E402

from .broker_fixture import BrokerProcess, in_arena_mapping  # noqa: E402


def _batch(seed: int, n: int = 6) -> dict[str, Any]:
    """verl-shaped: token ids (int64, ragged), per-token bf16 hidden rows, a ragged_idx-2 tensor, a dense one."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    lengths = [rng.randint(0, 40) for _ in range(n)]
    lengths[0] = max(lengths[0], 1)
    ids = torch.nested.nested_tensor(
        [torch.randint(0, 50_000, (k,), generator=g) for k in lengths], layout=torch.jagged
    )
    hidden = torch.nested.nested_tensor(
        [torch.randn(k, 4, generator=g).to(torch.bfloat16) for k in lengths], layout=torch.jagged
    )
    wide = torch.nested.nested_tensor([torch.randn(k, 3, generator=g) for k in lengths], layout=torch.jagged)
    return {
        "input_ids": ids,
        "hidden": hidden,
        "by_dim": wide.transpose(1, 2),  # _ragged_idx 2: samples (3, k)
        "reward": torch.randn(n, generator=g),
    }


def _samples(value: Any) -> list[Any]:
    return list(value.unbind()) if getattr(value, "is_nested", False) else list(value)


def _assert_same(got: Any, want: Any, rows: list[int] | None = None) -> None:
    if getattr(want, "is_nested", False):
        assert got.is_nested and got._ragged_idx == want._ragged_idx and got.dtype == want.dtype
        if rows is None and want._ragged_idx == 1:  # padded to the longest sample, not to all the values (verl)
            assert torch.equal(got.to_padded_tensor(0), want.to_padded_tensor(0))
    wanted = _samples(want)
    wanted = wanted if rows is None else [wanted[i] for i in rows]
    have = _samples(got)
    assert len(have) == len(wanted)
    for a, b in zip(have, wanted, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.fixture(params=["embedded", "broker"])
def queue_kw(request: pytest.FixtureRequest, store: Path) -> Iterator[dict[str, Any]]:
    if request.param == "embedded":
        yield {"storage_path": store}
    else:
        yield {"broker": request.getfixturevalue("broker").address}


def test_jagged_fields_round_trip_exactly(queue_kw: dict[str, Any], seed: int) -> None:
    data = _batch(seed)
    brokered = "broker" in queue_kw
    with SyncQueue("j", **queue_kw) as q:
        meta = q.put(data, partition_id="p")
        assert meta.samples[0].fields["input_ids"].kind == "jagged"
        assert meta.samples[0].fields["hidden"].shape == (-1, 4)
        assert meta.samples[0].fields["by_dim"].shape == (3, -1)
        got = q.get_data(meta)
        for name, value in data.items():
            _assert_same(got[name], value)
        if brokered:  # the consumer's values are views on the arena: no copy
            for name in ("input_ids", "hidden", "by_dim"):
                assert in_arena_mapping(got[name].values().data_ptr()), name
            assert q.stats()["zerocopy"]["put_copied_bytes"] == 0
        # a selection of samples, in another order, and what get_meta hands out
        _assert_same(q.get_data(meta.select_samples([4, 1, 2]))["hidden"], data["hidden"], [4, 1, 2])
        _assert_same(q.get_data(meta.select_samples([5, 0]))["by_dim"], data["by_dim"], [5, 0])
        taken = q.get_meta(["input_ids"], batch_size=4, task_name="t", partition_id="p")
        _assert_same(q.get_data(taken)["input_ids"], data["input_ids"], [0, 1, 2, 3])
        td, rest = q.get_batch(
            ["input_ids", "by_dim"], batch_size=4, task_name="t", partition_id="p", as_tensordict=True
        )
        assert rest.global_indexes == meta.global_indexes[4:] and td.batch_size == torch.Size([2])
        _assert_same(td["by_dim"], data["by_dim"], [4, 5])
        if brokered:
            assert in_arena_mapping(td["input_ids"].values().data_ptr())
        # two puts: one jagged tensor joined from both (a copy)
        more = q.put(_batch(seed + 1), partition_id="p")
        joined = q.get_data(meta.concat([meta, more]))["input_ids"]
        assert [t.tolist() for t in joined.unbind()] == [
            t.tolist() for t in [*data["input_ids"].unbind(), *_batch(seed + 1)["input_ids"].unbind()]
        ]
        q.flush()
        records = q.get(limit=2)  # records: one row per sample, the sample as a plain tensor
        assert torch.equal(records[1]["input_ids"], data["input_ids"][1])
    with SyncQueue("j", **queue_kw) as q:  # read back after a close (from Lance once flushed)
        got = q.get_data(meta, as_tensordict=True)
        for name, value in data.items():
            _assert_same(got[name], value)


def test_in_place_writes_into_a_jagged_field_never_reach_the_stored_batch(queue_kw: dict[str, Any], seed: int) -> None:
    """A consumer that changes a jagged tensor it got (its values, in place) changes its own copy only: a second
    task and a read after a flush see what was put (the arena views are copy-on-write, as for dense fields)."""
    data = _batch(seed)
    with SyncQueue("j", **queue_kw) as q:
        meta = q.put(data, partition_id="p")
        got = q.get_data(meta)
        if "broker" in queue_kw:
            assert in_arena_mapping(got["input_ids"].values().data_ptr())  # zero-copy, yet the writes stay private
        got["input_ids"].values().add_(1)
        got["hidden"].values().mul_(0)
        got["by_dim"].values().fill_(7)
        again = q.get_meta(list(data), batch_size=6, task_name="other", partition_id="p")
        for name, value in q.get_data(again).items():
            _assert_same(value, data[name])
        q.flush()
        for name, value in q.get_data(meta).items():
            _assert_same(value, data[name])
    with SyncQueue("j", **queue_kw) as q:
        for name, value in q.get_data(meta).items():
            _assert_same(value, data[name])


def test_jagged_fields_written_later_to_existing_samples(queue_kw: dict[str, Any], seed: int) -> None:
    data = _batch(seed)
    with SyncQueue("patch", **queue_kw) as q:
        meta = q.put({"reward": data["reward"]}, partition_id="p")
        assert q.get_meta(["response"], batch_size=6, task_name="t", partition_id="p").size == 0
        part = meta.select_samples([1, 3])  # a reward model's answer for some samples first
        q.put(
            {"response": torch.nested.nested_tensor([data["input_ids"][1], data["input_ids"][3]], layout=torch.jagged)},
            batch_meta=part,
        )
        ready = q.get_meta(["response", "reward"], batch_size=6, task_name="t", partition_id="p")
        assert ready.global_indexes == part.global_indexes
        _assert_same(q.get_data(ready)["response"], data["input_ids"], [1, 3])
        both = q.put({"response": data["input_ids"]}, batch_meta=meta)  # every sample, the two again (latest wins)
        assert both is not None and both.samples[0].fields["response"].kind == "jagged"
        _assert_same(q.get_data(both)["response"], data["input_ids"])


def test_lance_holds_a_jagged_field_as_variable_shape_rows_any_arrow_reader_understands(
    queue_kw: dict[str, Any], store: Path, request: pytest.FixtureRequest, seed: int
) -> None:
    lance = pytest.importorskip("lance")
    data = _batch(seed)
    with SyncQueue("lance", **queue_kw, num_buckets=1) as q:
        q.put(data, partition_id="p")
        q.flush()
    root = request.getfixturevalue("broker").storage if "broker" in queue_kw else store
    table = lance.dataset(str(root / "lance" / "bucket-0.lance")).to_table()
    table = table.sort_by("_persisting_index")
    for name in ("input_ids", "hidden", "by_dim"):
        field = table.schema.field(name)
        meta = {k.decode(): v.decode() for k, v in field.metadata.items()}
        assert meta["persisting.layout"] == "variable_shape_tensor" and meta["persisting.kind"] == "jagged"
        assert meta["persisting.ragged_dim"] == ("1" if name == "by_dim" else "0")
        want = _samples(data[name])
        for row, sample in zip(table.column(name).to_pylist(), want, strict=True):
            assert row["shape"] == list(sample.shape)
            flat = sample.reshape(-1)
            if sample.dtype == torch.bfloat16:
                flat = flat.view(torch.int16).numpy().view(np.uint16)  # bf16 is stored as its uint16 bits
            assert row["data"] == np.asarray(flat).tolist()


@pytest.mark.slow
def test_acknowledged_jagged_batches_survive_kill_9_of_the_broker(
    broker: BrokerProcess, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The restarted brokers write behind late: the second round's payload is only in the log and the arena file
    # when the broker is killed, so the next start re-adopts it from there.
    monkeypatch.setenv("PERSISTING_WRITE_BEHIND_IDLE", "60")
    monkeypatch.setenv("PERSISTING_WRITE_BEHIND_MAX", "120")
    rng = random.Random(seed)
    puts = []
    with SyncQueue("crash", broker=broker.address) as q:
        for round_ in range(2):
            for k in range(rng.randint(2, 4)):
                data = _batch(seed * 100 + round_ * 10 + k, n=rng.randint(1, 8))
                puts.append((q.put(data, partition_id=f"r{round_}"), data))
            if round_ == 0:
                q.flush()  # some in Lance, the rest only in the log and the arena the killed broker leaves
            broker.kill()
            broker.start()
        for meta, data in puts:
            got = q.get_data(meta)
            for name, value in data.items():
                _assert_same(got[name], value)
        stored = len(q)
        assert stored == sum(meta.size for meta, _ in puts)  # each acknowledged batch there exactly once


def test_bad_jagged_input_gets_a_clear_error(store: Path) -> None:
    with SyncQueue("bad", storage_path=store) as q:
        strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
        with pytest.raises(InvalidRecordError, match=r"layout=torch\.jagged"):
            q.put({"x": strided}, partition_id="p")
        holes = torch.nested.nested_tensor_from_jagged(
            torch.arange(10), offsets=torch.tensor([0, 4, 8]), lengths=torch.tensor([2, 3])
        )
        with pytest.raises(InvalidRecordError, match="holes"):
            q.put({"x": holes}, partition_id="p")
        ids = torch.nested.nested_tensor([torch.arange(2), torch.arange(3)], layout=torch.jagged)
        with pytest.raises(InvalidRecordError, match="batch dimension 3"):
            q.put({"x": ids, "y": torch.zeros(3)}, partition_id="p")
        with pytest.raises(InvalidRecordError, match="tensor batch"):
            q.put({"x": ids})  # a record
        q.put({"x": ids}, partition_id="p")
        with pytest.raises(SchemaConflictError):
            q.put({"x": torch.zeros(2, 3)}, partition_id="p")
        assert len(q) == 2  # nothing of the refused puts stored


def test_malformed_jagged_layouts_from_a_peer_are_refused() -> None:
    extent = np.zeros(4096, dtype=np.uint8)
    extent[256:288].view("<i8")[:] = [0, 3, 2, 5]  # offsets that go back

    def view(offset: int, nbytes: int) -> np.ndarray:
        return extent[offset : offset + nbytes]

    good = ["x", "jagged", "int64", [-1], 0, 40, 256, 5]
    with pytest.raises(ProtocolError, match="offsets"):
        jagged.from_arena(good, 3, view, 4096)
    extent[256:288].view("<i8")[:] = [0, 3, 4, 5]
    assert jagged.from_arena(good, 3, view, 4096).offsets.tolist() == [0, 3, 4, 5]
    for bad in (
        ["x", "jagged", "int64", [-1], 0, 48, 256, 5],  # bytes that do not fit the values
        ["x", "jagged", "int64", [-1, -1], 0, 40, 256, 5],  # two ragged dimensions
        ["x", "jagged", "int64", [4], 0, 40, 256, 5],  # none
        ["x", "jagged", "int64", [-1], 0, 40, 8, 5],  # offsets inside the values
        ["x", "jagged", "int64", [-1], 0, 40, 4090, 5],  # outside the extent
        ["x", "jagged", "int64", [-1], 0, 40, 256, 6],  # offsets end before the values do
    ):
        with pytest.raises(ProtocolError):
            jagged.from_arena(bad, 3, view, 4096)
    with pytest.raises(ConfigError, match="force"):
        one = jagged.JaggedColumn("int64", np.arange(3), np.array([0, 3]), 0)
        jagged.joined("x", [one, one], "force", None)


def test_jagged_fields_cross_nodes_as_values_and_offsets(seed: int) -> None:
    """persisting.ray's transfer form (what Ray's object store carries between nodes) keeps jagged fields."""
    from persisting.ray import transfer

    data = _batch(seed)
    packed, kinds = transfer.pack(data)
    assert all(isinstance(a, np.ndarray) for a in packed["hidden"][:2])  # numpy: out of band in Ray's store
    got = transfer.unpack(packed, kinds)
    for name, value in data.items():
        _assert_same(got[name], value)


def test_the_broker_refuses_a_jagged_layout_that_lies_and_keeps_serving(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    from persisting.tensors import batches

    good = batches.wire_field
    data = _batch(seed)
    with SyncQueue("lies", broker=broker.address) as q:
        for lie in (
            lambda e: [*e[:7], e[7] + 1],  # more values than were written
            lambda e: [*e[:6], e[4], e[7]],  # offsets said to lie on the values
            lambda e: [*e[:3], [-1, -1], *e[4:]],  # two ragged dimensions
        ):
            monkeypatch.setattr(batches, "wire_field", lambda name, col, off, lie=lie: _lied(good(name, col, off), lie))
            with pytest.raises(ProtocolError):
                q.put({"input_ids": data["input_ids"]}, partition_id="p")
        monkeypatch.setattr(batches, "wire_field", good)
        meta = q.put({"input_ids": data["input_ids"]}, partition_id="p")
        _assert_same(q.get_data(meta)["input_ids"], data["input_ids"])
        assert len(q) == meta.size  # nothing of the refused puts was stored


def _lied(entry: list[Any], lie: Any) -> list[Any]:
    return lie(entry) if entry[1] == "jagged" else entry
