"""Dense tensor fields read back from Lance as columns (engine/columnar.py, storage/lance_dense.py, wire/columns.py):
every byte exact, in embedded and broker mode, for patched fields, a mix of flushed and unflushed samples, samples
in several Lance fragments, variable shapes (the row path), cleared samples, a read while flushes and compactions
run, and a broker killed with SIGKILL mid-read."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import Queue, SyncQueue
from persisting.client import _loop
from persisting.engine.reader import Reader
from persisting.errors import ConfigError
from persisting.tensors.meta import BatchMeta
from persisting.wire import columns

from .broker_fixture import running_broker


class _Columnar:
    """Records which fields each read took as columns (a spy around the real method: nothing is faked)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fields: list[list[str]] = []
        real = Reader.dense_values

        async def spy(reader: Reader, indexes: list[int], fields: list[str]) -> Any:
            out = await real(reader, indexes, fields)
            self.fields.append(sorted(out))
            return out

        monkeypatch.setattr(Reader, "dense_values", spy)


def _batch(seed: int, n: int) -> dict[str, Any]:
    import torch

    rng = np.random.default_rng(seed)
    return {
        "x": rng.random((n, 3, 4), dtype=np.float32),
        "ids": rng.integers(-(2**40), 2**40, n),  # 0-d samples: a scalar column
        "mask": rng.random((n, 5)) > 0.5,
        "z": (rng.random((n, 2)) + 1j * rng.random((n, 2))).astype(np.complex64),
        "big": rng.integers(0, 1000, (n, 2)).astype(">i4"),  # not native: stored native, read back as put
        "t": torch.from_numpy(rng.random((n, 6), dtype=np.float32)).to(torch.bfloat16),
        "step": [seed * 1000 + k for k in range(n)],
    }


def _check(got: Any, want: list[dict[str, Any]], picks: list[tuple[int, int]]) -> None:
    """``got`` holds sample ``k`` of batch ``b`` for each (b, k) of ``picks``, in that order."""
    import torch

    for name in ("x", "ids", "mask", "z", "big"):
        expect = np.stack([np.asarray(want[b][name][k]) for b, k in picks])
        assert np.can_cast(got[name].dtype, expect.dtype, "equiv") and got[name].shape == expect.shape, name
        assert got[name].astype(expect.dtype).tobytes() == expect.tobytes(), name  # (">i4" may come back native)
    expect_t = torch.stack([want[b]["t"][k] for b, k in picks])
    assert got["t"].dtype == torch.bfloat16 and torch.equal(got["t"].view(torch.int16), expect_t.view(torch.int16))
    assert got["step"] == [want[b]["step"][k] for b, k in picks]


DENSE = ["big", "ids", "mask", "t", "x", "z"]


def test_flushed_batches_in_several_fragments_read_as_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    spy = _Columnar(monkeypatch)
    with SyncQueue("c", storage_path=tmp_path / "data", num_buckets=2) as q:
        want = [_batch(seed + b, 7) for b in range(4)]
        metas = []
        for b in range(4):
            metas.append(q.put(want[b], partition_id="p"))
            if b < 3:
                q.flush()  # one Lance fragment per flush and bucket; the last batch stays in the tail
        picks = [(b, k) for b in range(4) for k in range(7)]
        rng.shuffle(picks)
        meta = BatchMeta(tuple(metas[b].samples[k] for b, k in picks), metas[0].extra_info)
        got = q.get_data(meta)
        assert spy.fields[-1] == DENSE
        _check(got, want, picks)
        got["x"][:] = -1.0  # the consumer's own copy: what is stored does not change
        _check(q.get_data(meta), want, picks)
        q.clear([metas[1].global_indexes[2]], partition_id="p")
        with pytest.raises(ConfigError, match="cleared"):
            q.get_data(metas[1])


def test_patched_fields_and_unflushed_samples_in_one_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Columnar(monkeypatch)
    with SyncQueue("c", storage_path=tmp_path / "data") as q:
        first = q.put({"x": np.arange(24, dtype=np.float32).reshape(6, 4)}, partition_id="p")
        q.put({"x": np.full((2, 4), 100, np.float32)}, partition_id="p", batch_meta=first.select_samples([1, 2]))
        q.flush()
        q.put({"x": np.full((1, 4), 200, np.float32)}, partition_id="p", batch_meta=first.select_samples([2]))
        second = q.put({"x": np.full((2, 4), 7, np.float32)}, partition_id="p")
        meta = BatchMeta((*first.samples, *second.samples), first.extra_info)
        got = q.get_data(meta)
        assert spy.fields[-1] == ["x"]
        want = np.arange(24, dtype=np.float32).reshape(6, 4)
        want[1], want[2] = 100, 200  # the latest row that wrote the field wins
        np.testing.assert_array_equal(got["x"], np.concatenate([want, np.full((2, 4), 7, np.float32)]))
        q.flush()
        np.testing.assert_array_equal(q.get_data(meta)["x"][:6], want)
        assert spy.fields[-1] == ["x"]


def test_variable_shapes_take_the_row_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Columnar(monkeypatch)
    with SyncQueue("c", storage_path=tmp_path / "data", num_buckets=1) as q:
        a = q.put({"x": np.ones((2, 3), np.float32), "y": np.zeros((2, 1), np.int8)}, partition_id="p")
        b = q.put({"x": np.ones((2, 5), np.float32) * 2, "y": np.ones((2, 1), np.int8)}, partition_id="p")
        q.flush()  # x: a variable-shape column; y: fixed shape
        np.testing.assert_array_equal(q.get_data(a)["x"], np.ones((2, 3), np.float32))
        assert spy.fields[-1] == ["y"]
        got = q.get_data(BatchMeta((*a.samples, *b.samples), a.extra_info))
        assert [s.shape for s in got["x"]] == [(3,), (3,), (5,), (5,)]
        np.testing.assert_array_equal(got["y"], np.array([[0], [0], [1], [1]], np.int8))
    with SyncQueue("d", storage_path=tmp_path / "data", num_buckets=4) as q:
        a = q.put({"x": np.ones((2, 3), np.float32)}, partition_id="p")
        b = q.put({"x": np.ones((2, 5), np.float32) * 2}, partition_id="p")
        q.flush()  # fixed shapes in each bucket, not the same in all
        got = q.get_data(BatchMeta((*a.samples, *b.samples), a.extra_info))
        assert spy.fields[-1] == [] and [s.shape for s in got["x"]] == [(3,), (3,), (5,), (5,)]
        assert [float(s[0]) for s in got["x"]] == [1.0, 1.0, 2.0, 2.0]


def test_reads_while_flushes_and_compactions_run(tmp_path: Path) -> None:
    options = {"compact_min_fragments": 2, "target_rows_per_fragment": 10_000, "retain_seconds": 0.0}

    async def main() -> None:
        async with Queue("c", storage_path=tmp_path / "data", num_buckets=1, backend_options=options) as q:
            stored: list[tuple[Any, np.ndarray]] = []
            done = asyncio.Event()

            async def write() -> None:
                for i in range(24):
                    x = np.full((4, 64), i, np.float32) + np.arange(64, dtype=np.float32)
                    stored.append((await q.put({"x": x}, partition_id="p"), x))
                    await q.flush()
                    await _loop.call(q._handle.opened.engine_topic.maintain())  # type: ignore[union-attr]  # as the flusher does
                done.set()

            async def read() -> int:
                reads = 0
                while not done.is_set() or reads < 10:
                    for meta, x in list(stored):
                        np.testing.assert_array_equal((await q.get_data(meta))["x"], x)
                        reads += 1
                    await asyncio.sleep(0)
                return reads

            _, reads = await asyncio.gather(write(), read())
            assert reads >= 10
            whole = BatchMeta(tuple(s for meta, _ in stored for s in meta.samples), stored[0][0].extra_info)
            np.testing.assert_array_equal((await q.get_data(whole))["x"], np.concatenate([x for _, x in stored]))

    asyncio.run(main())


class _Frames:
    """Records the fields that came as raw frames (a spy around the real decoder in this client process)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fields: list[list[str]] = []
        real = columns.arrays

        def spy(entries: Any, buffers: Any, n: int) -> Any:
            out = real(entries, buffers, n)
            self.fields.append(sorted(out))
            return out

        monkeypatch.setattr(columns, "arrays", spy)


def test_broker_reads_flushed_fields_as_raw_frames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    frames = _Frames(monkeypatch)
    want = [_batch(seed + b, 5) for b in range(3)]
    with running_broker(tmp_path, ["--arena-bytes", str(8 * 1024 * 1024)]) as b:
        with SyncQueue("c", storage_path=b.storage, broker=b.address) as q:
            metas = [q.put(want[0], partition_id="p"), q.put(want[1], partition_id="p")]
            q.put({"x": want[2]["x"][:2]}, partition_id="p", batch_meta=metas[0].select_samples([1, 3]))
            q.flush()
        assert b.stop() == 0
        b.start()  # a fresh arena: what was put is in Lance only
        want[0]["x"][[1, 3]] = want[2]["x"][:2]
        with SyncQueue("c", storage_path=b.storage, broker=b.address) as q:
            metas.append(q.put(want[2], partition_id="p"))  # in the new arena, not flushed
            picks = [(b_, k) for b_ in (2, 0, 1) for k in range(5)]
            meta = BatchMeta(tuple(metas[b_].samples[k] for b_, k in picks), metas[0].extra_info)
            got = q.get_data(meta)
            _check(got, want, picks)
            assert frames.fields[-1] == DENSE  # not all in the arena: no views, the unflushed ones from rows
            flushed = BatchMeta((*metas[0].samples, *metas[1].samples), metas[0].extra_info)
            got = q.get_data(flushed)
            assert frames.fields[-1] == DENSE
            _check(got, want, [(b_, k) for b_ in (0, 1) for k in range(5)])
            got, taken = q.get_batch(["x", "t", "step"], 10, "train", "p")
            assert taken.global_indexes == flushed.global_indexes and frames.fields[-1] == ["t", "x"]
            np.testing.assert_array_equal(got["x"], np.concatenate([want[0]["x"], want[1]["x"]]))
        with SyncQueue("c", storage_path=b.storage, broker=b.address, zerocopy_mode="off") as q:
            got = q.get_data(metas[2])  # in the arena, but copies asked for: copied from there, not per sample
            assert frames.fields[-1] == DENSE
            _check(got, want, [(2, k) for k in range(5)])
            got["x"][:] = -1.0  # the consumer's own copy: the arena's samples do not change
            _check(q.get_data(metas[2]), want, [(2, k) for k in range(5)])


def test_broker_killed_mid_read_then_read_again(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    x = np.random.default_rng(seed).random((64, 64 * 1024), dtype=np.float32)  # 16 MiB in 64 samples
    with running_broker(tmp_path, ["--arena-bytes", str(8 * 1024 * 1024)]) as b:
        with SyncQueue("c", storage_path=b.storage, broker=b.address) as q:
            meta = q.put({"x": x}, partition_id="p")
            q.flush()
        for _round in range(3):
            b.stop()
            b.start()  # the arena forgets the batch: every read comes from Lance
            with SyncQueue("c", storage_path=b.storage, broker=b.address) as q:
                np.testing.assert_array_equal(q.get_data(meta)["x"], x)

                def kill_and_start(delay_s: float) -> None:
                    time.sleep(delay_s)
                    b.kill()
                    b.start()

                killer = threading.Thread(target=kill_and_start, args=(rng.uniform(0.0, 0.05),))
                killer.start()
                try:
                    for _ in range(5):  # reads before, across and after the kill: each one whole and exact
                        np.testing.assert_array_equal(q.get_data(meta)["x"], x)
                finally:
                    killer.join()
                got = q.get_data(meta)  # in pieces, each copied once into the one result: the consumer's own
                np.testing.assert_array_equal(got["x"], x)
                got["x"][:] = 0.0
                np.testing.assert_array_equal(q.get_data(meta)["x"], x)


def test_a_field_in_several_arrays_travels_as_one_frame_each() -> None:
    from persisting.errors import ProtocolError
    from persisting.tensors.column import Parts
    from persisting.tensors.pieces import Gathered

    rng = np.random.default_rng(random.randrange(2**32))
    a, b, c = rng.random((3, 4), dtype=np.float32), rng.random((2, 4), dtype=np.float32), rng.random((5, 2))
    entries, frames = columns.frames({"x": ("ndarray", "float32", Parts([a, b])), "y": ("ndarray", "float64", c)})
    assert [e[4] if len(e) == 5 else None for e in entries] == [[3, 2], None] and len(frames) == 3
    got = columns.arrays(entries, [f.bytes for f in frames], 5)
    assert isinstance(got["x"][2], Parts) and not isinstance(got["y"][2], Parts)
    gathered = Gathered(5)
    gathered.add(0, 5, {"x": got["x"][2], "y": got["y"][2]})
    assert gathered.out["x"].tobytes() == np.concatenate([a, b]).tobytes()
    assert gathered.out["y"].tobytes() == c.tobytes()
    with pytest.raises(ProtocolError, match="frames of"):
        columns.arrays([[*entries[0][:4], [3, 1]], entries[1]], [f.bytes for f in frames], 5)
    with pytest.raises(ProtocolError, match="name 2 frames for 3"):
        columns.arrays([entries[0]], [f.bytes for f in frames], 5)
