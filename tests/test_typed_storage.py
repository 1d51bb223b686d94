"""What lands in Lance: tensor fields as typed Arrow columns any Arrow reader opens, built over shared memory.

Every test reads the bucket datasets with plain ``lance.dataset`` / pyarrow (no persisting code on the read side)
and checks types, metadata and exact values; and reads the same topic back through ``Queue``.
"""

from __future__ import annotations

import asyncio
import random
import shutil
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

from persisting import Queue
from persisting.engine.tail import ArenaPayload, Chunk, tensor_parts
from persisting.storage import tensor_columns
from persisting.storage.lance_backend import LanceBackend
from persisting.storage.lance_columns import rewrite_name
from persisting.tensors.arena import Arena
from persisting.tensors.column import Column

FIXTURE = Path(__file__).parent / "fixtures" / "legacy_topic"


def _column(store: Path, topic: str, name: str) -> tuple[pa.Field, pa.ChunkedArray]:
    """The column ``name`` of every bucket of a topic, in global-index order, read with plain lance."""
    tables = []
    for bucket in sorted((store / topic).glob("bucket-*.lance")):
        ds = lance.dataset(str(bucket))
        if name in ds.schema.names:
            tables.append((ds.schema.field(name), ds.to_table(columns=[name, "_persisting_index"])))
    field = tables[0][0]
    table = pa.concat_tables([t for _, t in tables]).sort_by("_persisting_index")
    return field, table.column(name)


def test_tensor_batches_read_back_with_plain_lance_as_fixed_shape_tensors(tmp_path: Path, seed: int) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((8, 3, 4)).astype(np.float32)
    ids = rng.integers(-(2**40), 2**40, (8, 5))
    mask = rng.random((8, 6)) > 0.5
    reward = rng.standard_normal(8)
    act = torch.from_numpy(rng.standard_normal((8, 2)).astype(np.float32)).to(torch.bfloat16)
    cplx = (rng.standard_normal((8, 2)) + 1j * rng.standard_normal((8, 2))).astype(np.complex64)

    async def go() -> None:
        async with Queue("t", tmp_path, num_buckets=2) as q:
            data = {"obs": obs, "ids": ids, "mask": mask, "reward": reward, "act": act, "c": cplx}
            await q.put(data, partition_id="p")
            await q.flush()

    asyncio.run(go())
    field, col = _column(tmp_path, "t", "obs")
    assert isinstance(field.type, pa.FixedShapeTensorType) and field.type.shape == [3, 4]
    assert field.type.value_type == pa.float32()
    assert field.metadata[b"persisting.layout"] == b"fixed_shape_tensor"
    assert np.array_equal(col.combine_chunks().to_numpy_ndarray(), obs)
    field, col = _column(tmp_path, "t", "ids")
    assert field.type.value_type == pa.int64() and np.array_equal(col.combine_chunks().to_numpy_ndarray(), ids)
    field, col = _column(tmp_path, "t", "mask")  # bool as uint8 0/1: Arrow's bool is bit-packed
    assert field.type.value_type == pa.uint8() and field.metadata[b"persisting.dtype"] == b"|b1"
    assert np.array_equal(col.combine_chunks().to_numpy_ndarray().astype(bool), mask)
    field, col = _column(tmp_path, "t", "reward")  # 0-d samples: a plain float64 column
    assert field.type == pa.float64() and np.array_equal(col.to_numpy(), reward)
    field, col = _column(tmp_path, "t", "act")  # bfloat16: its bits as uint16, the dtype in the metadata
    assert field.type.value_type == pa.uint16() and field.metadata[b"persisting.dtype"] == b"bfloat16"
    assert field.metadata[b"persisting.kind"] == b"tensor"
    bits = col.combine_chunks().to_numpy_ndarray()
    assert np.array_equal(bits, act.view(torch.int16).numpy().view(np.uint16))
    field, col = _column(tmp_path, "t", "c")  # complex64: float32 pairs (real, imaginary)
    assert field.type.shape == [2, 2] and field.type.value_type == pa.float32()
    pairs = col.combine_chunks().to_numpy_ndarray()
    assert np.array_equal(pairs[..., 0] + 1j * pairs[..., 1], cplx)

    async def back() -> None:
        async with Queue("t", tmp_path, num_buckets=2) as q:
            meta = await q.get_meta(["obs", "ids", "mask", "reward", "act", "c"], 8, "t", "p")
            data = await q.get_data(meta)
            assert data["obs"].dtype == np.float32 and np.array_equal(data["obs"], obs)
            assert (
                np.array_equal(data["ids"], ids) and data["mask"].dtype == bool and np.array_equal(data["mask"], mask)
            )
            assert np.array_equal(data["reward"], reward) and np.array_equal(data["c"], cplx)
            assert isinstance(data["act"], torch.Tensor) and data["act"].dtype == torch.bfloat16
            assert torch.equal(data["act"], act)

    asyncio.run(back())


def test_records_with_arrays_are_typed_too_and_a_shape_change_moves_the_column_to_variable_shape(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with Queue("r", tmp_path, num_buckets=1) as q:
            await q.put_batch([{"id": i, "x": np.full((2, 3), i, np.int32)} for i in range(4)])
            await q.flush()
            field, _ = _column(tmp_path, "r", "x")
            assert isinstance(field.type, pa.FixedShapeTensorType) and field.type.shape == [2, 3]
            await q.put_batch([{"id": 9, "x": np.arange(5, dtype=np.int32)}, {"id": 10, "x": None}, {"id": 11}])
            await q.flush()
            rows = await q.get(limit=10)
            assert [r["x"].tolist() for r in rows[:4]] == [[[i] * 3] * 2 for i in range(4)]
            assert rows[4]["x"].tolist() == [0, 1, 2, 3, 4] and rows[4]["x"].dtype == np.int32
            assert rows[5] == {"id": 10, "x": None} and rows[6] == {"id": 11}  # explicit None kept, absent stays absent

    asyncio.run(go())
    field, col = _column(tmp_path, "r", "x")
    assert field.metadata[b"persisting.layout"] == b"variable_shape_tensor"
    assert pa.types.is_struct(field.type)
    values = col.to_pylist()
    assert values[0] == {"data": [0] * 6, "shape": [2, 3]} and values[4] == {"data": [0, 1, 2, 3, 4], "shape": [5]}
    assert values[5] is None and values[6] is None

    async def reopen() -> None:
        async with Queue("r", tmp_path, num_buckets=1) as q:  # the rewritten column reads back after a reopen
            rows = await q.get(limit=10)
            assert rows[4]["x"].tolist() == [0, 1, 2, 3, 4] and rows[1]["x"].tolist() == [[1] * 3] * 2

    asyncio.run(reopen())


def test_a_dtype_change_falls_back_to_the_bytes_layout_and_keeps_every_value(tmp_path: Path) -> None:
    async def go() -> None:
        async with Queue("d", tmp_path, num_buckets=1) as q:
            await q.put({"x": np.ones((2, 3), np.float32)}, partition_id="p")
            await q.flush()
            await q.put({"x": np.zeros((1, 3), np.float64)}, partition_id="p")
            await q.flush()
            rows = await q.get(limit=5)
            assert [r["x"].dtype for r in rows] == [np.float32, np.float32, np.float64]
            assert [r["x"].tolist() for r in rows] == [[1.0] * 3, [1.0] * 3, [0.0] * 3]

    asyncio.run(go())
    field, _ = _column(tmp_path, "d", "x")
    assert field.type == pa.large_binary() and field.metadata[b"persisting.layout"] == b"bytes"


def test_an_interrupted_column_rewrite_is_finished_or_undone_at_open(tmp_path: Path) -> None:
    """The state a kill -9 leaves between a rewrite's commits, made with Lance itself, then opened."""

    async def fill() -> None:
        async with Queue("w", tmp_path, num_buckets=1) as q:
            await q.put({"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, partition_id="p")

    asyncio.run(fill())
    uri = str(tmp_path / "w" / "bucket-0.lance")
    old = tensor_columns.Layout.of_field(lance.dataset(uri).schema.field("x"))
    new = tensor_columns.Layout(tensor_columns.VARIABLE, "ndarray", "<f4")
    temporary = rewrite_name("x")

    def step(batch: pa.RecordBatch) -> pa.RecordBatch:
        array = tensor_columns.convert(old, new, batch.column(0))
        return pa.RecordBatch.from_arrays([array], schema=pa.schema([new.field(temporary)]))

    lance.dataset(uri).add_columns(step, read_columns=["x"])  # killed after the first commit: undone at open

    async def check(layout: str) -> None:
        async with Queue("w", tmp_path, num_buckets=1) as q:
            rows = await q.get(limit=5)
            assert [r["x"].tolist() for r in rows] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
        ds = lance.dataset(uri)
        assert temporary not in ds.schema.names
        assert ds.schema.field("x").metadata[b"persisting.layout"] == layout.encode()

    asyncio.run(check("fixed_shape_tensor"))
    lance.dataset(uri).add_columns(step, read_columns=["x"])
    lance.dataset(uri).drop_columns(["x"])  # killed after the second commit: completed at open
    asyncio.run(check("variable_shape_tensor"))


def test_the_flush_hands_lance_buffers_that_lie_inside_the_arena_mapping(tmp_path: Path, seed: int) -> None:
    """An arena batch's columns are Arrow buffers over the shared-memory extent itself: no copy to the writer."""
    rng = np.random.default_rng(seed)
    arena = Arena.create(tmp_path / "test.arena", 4 * 1024 * 1024)
    seen: list[int] = []

    class Watching(LanceBackend):
        def _append(self, table: pa.Table) -> Any:
            for name in ("obs", "ids"):
                chunk = table.column(name).chunks[0]
                seen.append(chunk.storage.values.buffers()[1].address)
            return super()._append(table)

    try:
        obs_view = arena.view(4096, 16 * 64 * 4, writable=True).view(np.float32).reshape(16, 64)
        ids_view = arena.view(4096 + 16 * 64 * 4, 16 * 8 * 8, writable=True).view(np.int64).reshape(16, 8)
        obs_view[:] = rng.standard_normal((16, 64))
        ids_view[:] = rng.integers(0, 1000, (16, 8))
        columns = {"obs": Column("ndarray", "<f4", obs_view), "ids": Column("ndarray", "<i8", ids_view)}
        chunk = Chunk(0, "p", [{} for _ in range(16)], ArenaPayload(1, {}, columns))
        rows: list[dict[str, Any]] = [{"_persisting_index": i, "_persisting_partition": "p"} for i in range(16)]
        skip = 3
        rows = rows[skip:]
        parts = tensor_parts(rows, [(0, chunk, skip)], {"obs": "ndarray", "ids": "ndarray"})
        backend = Watching(0, str(tmp_path / "store"))
        (tmp_path / "store").mkdir()
        asyncio.run(backend.put_columns(rows, parts))
        assert len(seen) == 2 and all(arena.contains(address) for address in seen), "the writer got a copy"
        assert seen[0] == obs_view[skip:].ctypes.data  # the very samples, past the ones skipped
        ds = lance.dataset(str(tmp_path / "store" / "bucket-0.lance"))
        assert np.array_equal(ds.to_table().column("obs").combine_chunks().to_numpy_ndarray(), obs_view[skip:])
        assert np.array_equal(ds.to_table().column("ids").combine_chunks().to_numpy_ndarray(), ids_view[skip:])
    finally:
        arena.close()


def test_a_topic_written_by_persisting_0_1_opens_and_reads_back(tmp_path: Path) -> None:
    """tests/fixtures/legacy_topic was written by 0.1.0's codec (tensor values as msgpack blobs in large_binary)."""
    torch = pytest.importorskip("torch")
    store = tmp_path / "store"
    shutil.copytree(FIXTURE, store)
    field = lance.dataset(str(store / "legacy" / "bucket-0.lance")).schema.field("arr")
    assert field.type == pa.large_binary()  # the fixture really is the old layout

    async def go() -> None:
        async with Queue("legacy", store, num_buckets=2) as q:
            rows = await q.get(limit=20)
            assert len(rows) == 9
            for i, row in enumerate(rows[:6]):
                assert row["id"] == i and row["s"] == f"row{i}"
                assert (
                    row["arr"].dtype == np.float32 and row["arr"].tolist() == (np.arange(6).reshape(2, 3) + i).tolist()
                )
                assert row["t"].dtype == torch.bfloat16 and torch.equal(
                    row["t"], torch.arange(4, dtype=torch.bfloat16) * i
                )
                assert row["nested"] == {"a": [1, 2, (3, 4)], "b": "x"}
            meta = await q.get_meta(["obs", "act", "mask"], 3, "t", "p")
            data = await q.get_data(meta)
            assert np.array_equal(data["obs"], np.arange(12).reshape(3, 4)) and data["obs"].dtype == np.int64
            assert torch.equal(data["act"], torch.ones(3, 2, dtype=torch.float16))
            assert data["mask"].tolist() == [True, False, True]
            # The old topic takes new data: its old columns stay bytes, values stay exact.
            await q.put({"obs": np.full((2, 4), 7, np.int64), "act": torch.zeros(2, 2, dtype=torch.float16),
                         "mask": np.array([False, False])}, partition_id="p")  # fmt: skip
            await q.flush()
            meta = await q.get_meta(["obs", "act", "mask"], 2, "t", "p")
            data = await q.get_data(meta)
            assert data["obs"].tolist() == [[7] * 4] * 2 and data["mask"].tolist() == [False, False]

    asyncio.run(go())


def test_random_batches_of_random_layouts_round_trip_exactly(tmp_path: Path, seed: int) -> None:
    """Random puts (dtypes, shapes, records, batches, Nones) with flushes between: every value exact, whatever
    layout each column ends in."""
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.int16, np.uint8, np.bool_, np.float16]
    expected: list[dict[str, Any]] = []

    async def go() -> None:
        async with Queue("z", tmp_path, num_buckets=2) as q:
            for _step in range(12):
                name = rnd.choice(["a", "b", "c"])
                dtype = rnd.choice(dtypes) if rnd.random() < 0.3 else dtypes[ord(name) % len(dtypes)]
                shape = rnd.choice([(), (3,), (2, 2), (rnd.randint(0, 4),)])
                n = rnd.randint(1, 5)
                arr = (rng.random((n, *shape)) * 100).astype(dtype)
                if rnd.random() < 0.5:
                    await q.put({name: arr}, partition_id="p")
                    expected.extend({name: arr[i]} for i in range(n))
                else:
                    records = [{name: arr[i] if rnd.random() < 0.8 else None} for i in range(n)]
                    await q.put_batch(records)
                    expected.extend(records)
                if rnd.random() < 0.5:
                    await q.flush()
        async with Queue("z", tmp_path, num_buckets=2) as q:
            rows = await q.get(limit=len(expected) + 5)
        assert len(rows) == len(expected)
        for got, want in zip(rows, expected, strict=True):
            assert got.keys() == want.keys()
            for key, value in want.items():
                if value is None:
                    assert got[key] is None
                else:
                    assert got[key].dtype == value.dtype and got[key].shape == value.shape
                    assert np.array_equal(got[key], value)

    asyncio.run(go())


def test_nested_lists_of_one_scalar_type_are_native_list_columns_and_the_rest_stays_exact(tmp_path: Path) -> None:
    records = [
        {"a": [1, 2, 3], "b": [[0.5], [], [1.5, 2.0]], "c": ["x", "y"], "f": [True], "t": (1, 2), "d": {"k": 1}},
        {"a": [], "b": [], "c": [], "f": [], "t": (3,), "d": {"k": [2]}},
        {"a": None, "b": [[-0.0, float("inf")]], "c": ["z"], "f": [False, True]},
    ]

    async def go() -> None:
        async with Queue("n", tmp_path, num_buckets=1) as q:
            await q.put_batch(records)
            await q.flush()
            assert await q.get(limit=5) == records

    asyncio.run(go())
    assert _column(tmp_path, "n", "a")[0].type == pa.large_list(pa.int64())
    assert _column(tmp_path, "n", "b")[0].type == pa.large_list(pa.large_list(pa.float64()))
    assert _column(tmp_path, "n", "c")[0].type == pa.large_list(pa.large_string())
    assert _column(tmp_path, "n", "f")[0].type == pa.large_list(pa.bool_())
    assert _column(tmp_path, "n", "a")[1].to_pylist() == [[1, 2, 3], [], None]
    for name in ("t", "d"):  # a tuple must come back a tuple, a dict of mixed values exactly: msgpack bytes
        field, _ = _column(tmp_path, "n", name)
        assert field.type == pa.large_binary() and field.metadata[b"persisting.layout"] == b"bytes"

    async def more() -> None:
        async with Queue("n", tmp_path, num_buckets=1) as q:
            await q.put_batch([{"a": [1.5]}, {"a": [2**63]}])  # a float, then an int beyond int64: bytes from now on
            await q.flush()
            rows = await q.get(limit=10)
            assert rows[:3] == records and rows[3] == {"a": [1.5]} and rows[4] == {"a": [2**63]}
            assert type(rows[0]["a"][0]) is int and type(rows[3]["a"][0]) is float

    asyncio.run(more())
    assert _column(tmp_path, "n", "a")[0].type == pa.large_binary()
