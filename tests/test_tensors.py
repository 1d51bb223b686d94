"""Tensor batches in embedded mode: round trips of dtypes and shapes, kinds kept, consume-on-fetch, persistence."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from persisting import BatchMeta, ConfigError, InvalidRecordError, Queue, SyncQueue

NUMPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]
TORCH_DTYPES = [torch.bool, torch.int8, torch.int64, torch.uint8, torch.float16, torch.bfloat16, torch.float32]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _random(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


async def _put_get(store: Path, data: dict[str, Any], n: int, fields: list[str]) -> tuple[BatchMeta, dict[str, Any]]:
    async with Queue("t", store) as q:
        meta = await q.put(data, partition_id="p")
        got = await q.get_meta(fields, n + 5, "task", "p")
        assert got.global_indexes == meta.global_indexes
        return meta, await q.get_data(got)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", [(4,), (3, 5), (2, 0, 3), (1, 2, 3, 4)])
def test_numpy_round_trip(store: Path, dtype: str, shape: tuple[int, ...], seed: int) -> None:
    arr = _random(dtype, shape, np.random.default_rng(seed))
    meta, data = _run(_put_get(store, {"x": arr}, shape[0], ["x"]))
    assert meta.size == shape[0]
    assert meta.samples[0].fields["x"].shape == shape[1:]
    out = data["x"]
    assert isinstance(out, np.ndarray) and out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_round_trip_keeps_torch_and_dtype(store: Path, dtype: torch.dtype, seed: int) -> None:
    torch.manual_seed(seed)
    t = (torch.randn(6, 3, 2) * 50).to(dtype)
    _, data = _run(_put_get(store, {"t": t}, 6, ["t"]))
    out = data["t"]
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == t.shape
    assert torch.equal(out, t)


def test_non_contiguous_inputs_and_mixed_kinds(store: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((8, 6)).astype(np.float32)
    strided = base[:, ::2]  # non-contiguous numpy
    tt = torch.arange(48).reshape(6, 8).T  # non-contiguous torch, batch dim 8
    data = {"a": strided, "b": tt, "label": [f"s{i}" for i in range(8)], "score": [float(i) for i in range(8)]}
    meta, out = _run(_put_get(store, data, 8, ["a", "b", "label", "score"]))
    assert not strided.flags.c_contiguous and not tt.is_contiguous()
    np.testing.assert_array_equal(out["a"], strided)
    assert torch.equal(out["b"], tt)
    assert out["label"] == [f"s{i}" for i in range(8)] and out["score"] == [float(i) for i in range(8)]
    assert set(meta.field_names) == {"a", "b", "label", "score"}


def test_0d_samples_and_empty_batches(store: Path) -> None:
    async def go() -> None:
        async with Queue("t", store) as q:
            empty = await q.put({"x": np.zeros((0, 3), np.float32)}, partition_id="p")
            assert empty.size == 0 and await q.get_data(empty) == {}
            meta = await q.put({"x": np.arange(5, dtype=np.int32)}, partition_id="p")  # each sample is 0-d
            assert meta.samples[0].fields["x"].shape == ()
            got = await q.get_data(await q.get_meta(["x"], 10, "t", "p"))
            np.testing.assert_array_equal(got["x"], np.arange(5, dtype=np.int32))
            assert (await q.get_meta(["x"], 10, "t", "p")).size == 0

    _run(go())


def test_consume_on_fetch_per_task_and_partitions_stay_apart(store: Path) -> None:
    async def go() -> None:
        async with Queue("t", store) as q:
            await q.put({"x": np.arange(10)}, partition_id="a")
            await q.put({"x": np.arange(100, 104)}, partition_id="b")
            await q.put({"x": np.arange(10, 20)}, partition_id="a")
            seen: list[int] = []
            while True:
                meta = await q.get_meta(["x"], 3, "train", "a")
                if meta.size == 0:
                    break
                seen.extend(int(v) for v in (await q.get_data(meta))["x"])
            assert seen == list(range(20))  # every sample of "a" once, none of "b"
            other = await q.get_data(await q.get_meta(["x"], 100, "reward", "a"))  # another task: its own pass
            assert list(other["x"]) == list(range(20))
            b = await q.get_data(await q.get_meta(["x"], 100, "train", "b"))
            assert list(b["x"]) == [100, 101, 102, 103]

    _run(go())


def test_tensor_batches_persist_and_read_back_from_lance(store: Path, seed: int) -> None:
    arr = _random("float32", (50, 7), np.random.default_rng(seed))

    async def put() -> None:
        async with Queue("t", store, batch_size=10) as q:
            await q.put({"x": arr, "y": torch.from_numpy(arr[:, :2].copy())}, partition_id="p")

    async def read() -> None:
        async with Queue("t", store) as q:
            assert (await q.stats())["flushed"] == 50
            got = await q.get_data(await q.get_meta(["x", "y"], 50, "t", "p"))
            np.testing.assert_array_equal(got["x"], arr)
            assert torch.equal(got["y"], torch.from_numpy(arr[:, :2].copy()))
            records = await q.get(2)  # each sample is also a record of the topic
            np.testing.assert_array_equal(records[1]["x"], arr[1])

    _run(put())
    _run(read())


def test_variable_shapes_come_back_as_a_list(store: Path) -> None:
    async def go() -> None:
        async with Queue("t", store) as q:
            await q.put({"x": np.zeros((2, 3))}, partition_id="p")
            await q.put({"x": np.ones((1, 4))}, partition_id="p")
            got = await q.get_data(await q.get_meta(["x"], 3, "t", "p"))
            assert isinstance(got["x"], list) and [a.shape for a in got["x"]] == [(3,), (3,), (4,)]

    _run(go())


def test_bad_batches_get_clear_errors(store: Path) -> None:
    async def go() -> None:
        async with Queue("t", store) as q:
            with pytest.raises(InvalidRecordError, match="batch dimension 3, field 'a' has 2"):
                await q.put({"a": np.zeros(2), "b": np.zeros(3)}, partition_id="p")
            with pytest.raises(InvalidRecordError, match="0-d"):
                await q.put({"a": np.array(1.0)}, partition_id="p")
            with pytest.raises(InvalidRecordError, match="cannot go in a tensor batch"):
                await q.put({"a": np.array([object()] * 2)}, partition_id="p")
            with pytest.raises(InvalidRecordError, match="has 3 samples"):
                await q.put({"a": np.zeros(2), "b": [1, 2, 3]}, partition_id="p")
            with pytest.raises(InvalidRecordError, match="dict of arrays"):
                await q.put([np.zeros(2)], partition_id="p")
            # one sample Lance cannot store (an Arrow list's length is an int32): refused at put, never a stuck flush
            with pytest.raises(InvalidRecordError, match="one sample holds 2147483648 elements"):
                await q.put({"a": np.empty((1, 2**31), np.uint8)}, partition_id="p")  # (np.empty: never touched)
            with pytest.raises(ConfigError, match="sampler must have sample"):
                await q.get_meta(None, 1, "t", "p", sampler=object())
            with pytest.raises(ConfigError, match="needs broker mode"):
                await Queue("t2", store, zerocopy_mode="force").put({"a": np.zeros(2)}, partition_id="p")
            assert len(q) == 0  # nothing half-stored

    _run(go())


def test_batch_meta_dict_round_trip(store: Path) -> None:
    async def go() -> BatchMeta:
        async with Queue("t", store) as q:
            return await q.put({"a": np.zeros((3, 2), np.float16), "s": ["x", "y", "z"]}, partition_id="p")

    meta = _run(go())
    again = BatchMeta.from_dict(meta.to_dict())
    assert again == meta and again.global_indexes == [0, 1, 2]


def test_sync_twin_has_the_tensor_calls(store: Path) -> None:
    with SyncQueue("t", store) as q:
        meta = q.put({"x": np.arange(6).reshape(3, 2)}, partition_id="p")
        data, got = q.get_batch(["x"], 3, "t", "p")
        assert got.global_indexes == meta.global_indexes
        np.testing.assert_array_equal(data["x"], np.arange(6).reshape(3, 2))


@pytest.mark.parametrize(
    "kind_dtype", [("ndarray", "<f4"), ("ndarray", "|b1"), ("ndarray", "<i8"), ("tensor", "bfloat16")]
)
@pytest.mark.parametrize("shape", [(), (3,), (2, 0), (4, 5)])
def test_columnar_encoding_matches_the_per_sample_one(kind_dtype: tuple[str, str], shape: tuple[int, ...]) -> None:
    """Columns in the bytes layout are encoded whole; a sample must read back exactly as if encoded alone."""
    from persisting.storage.tensor_columns import encoded
    from persisting.tensors.column import storage_dtype
    from persisting.wire import codec

    kind, dtype_name = kind_dtype
    arr = (np.arange(6 * int(np.prod(shape, dtype=np.int64))) % 7).astype(storage_dtype(kind, dtype_name))
    arr = arr.reshape((6, *shape))
    values = encoded(kind, dtype_name, arr[2:]).to_pylist()
    assert values == [codec.encode_sample(kind, dtype_name, arr[i]) for i in range(2, 6)]


def test_get_meta_waits_for_a_full_batch(store: Path) -> None:
    async def go() -> None:
        async with Queue("t", store) as q:
            t0 = asyncio.get_running_loop().time()
            assert (await q.get_meta(["x"], 4, "t", "p", wait=True, timeout=0.2)).size == 0
            assert asyncio.get_running_loop().time() - t0 >= 0.15
            waiting = asyncio.ensure_future(q.get_meta(["x"], 4, "t", "p", wait=True, timeout=10))
            await q.put({"x": np.zeros((2, 3))}, partition_id="p")
            await asyncio.sleep(0.1)
            assert not waiting.done()  # 2 of 4 samples: it keeps waiting
            await q.put({"x": np.ones((3, 3))}, partition_id="p")
            meta = await asyncio.wait_for(waiting, 10)
            assert meta.global_indexes == [0, 1, 2, 3]
            partial = await q.get_meta(["x"], 4, "t", "p", wait=True, timeout=0.1)
            assert partial.global_indexes == [4]  # timed out: what there is

    _run(go())
