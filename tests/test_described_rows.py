"""Describing flushed samples without reading their dense payload (storage/lance_described, engine/describing).

A random mix of puts (dense numpy and torch fields of several dtypes and shapes, 0-d samples, a field whose shape
changes between puts, jagged fields, Python objects, fields some puts leave out, fields written later by patches,
deduped values), part of it flushed to Lance before a reopen and part still in the tail: ``get_meta`` describes
every sample exactly as the row path did (the same meta with the backend's ``get_described`` taken away, so the
engine reads the rows whole), and as the values ``get_data`` reads back say. Then the broker's memory: a
flushed batch of several times the arena taken with ``get_batch`` grows the broker's RSS (VmHWM, reset before
the get) by at most the arena plus a stated constant, not by a multiple of the batch."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from persisting import BatchMeta, SyncQueue
from persisting.storage import lance_described
from persisting.storage.lance_backend import LanceBackend

from .broker_fixture import running_broker

PARTITION = "p"


def _put_one(q: SyncQueue, rng: random.Random, metas: list[BatchMeta], every: bool = False) -> None:
    """One random put, or a patch of samples put before (``every``: a put with every kind of field)."""
    chance = (lambda p: True) if every else (lambda p: rng.random() < p)
    if metas and not every and rng.random() < 0.25:
        target = rng.choice(metas)
        picks = sorted(rng.sample(range(target.size), rng.randint(1, target.size)))
        sub = target.select_samples(picks)
        n = sub.size
        patch: dict[str, Any] = {}
        if rng.random() < 0.6:
            patch["late"] = np.full((n, rng.randint(1, 4)), rng.random(), dtype=np.float64)
        if rng.random() < 0.5 or not patch:
            patch["note"] = [f"patched {rng.random()}" for _ in range(n)]
        q.put(patch, partition_id=PARTITION, batch_meta=sub)
        return
    n = rng.randint(1, 6)
    data: dict[str, Any] = {}
    dtype = rng.choice([np.float32, np.int64, np.float16, np.bool_, np.complex64, np.uint8])
    if chance(0.8):
        shape = (n, *rng.choice([(2, 3), (4,), (2, 3)]))  # the same field changes shape now and then
        data["x"] = np.ones(shape, dtype=dtype)
    if chance(0.6):
        data["t"] = torch.ones((n, 3), dtype=rng.choice([torch.bfloat16, torch.float32, torch.int32]))
    if chance(0.5):
        data["s"] = np.arange(n, dtype=np.int32)  # 0-d samples: a scalar column
    if chance(0.4):
        lengths = [rng.randint(0, 5) for _ in range(n)]
        data["j"] = torch.nested.nested_tensor([torch.arange(k) for k in lengths], layout=torch.jagged)
    if chance(0.5):
        data["o"] = [f"text {i}" for i in range(n)]
    if chance(0.3):
        data["l"] = [[i, i + 1] for i in range(n)]
    if chance(0.5):
        image = np.full((n, 2, 2), rng.randint(0, 3), dtype=np.float32)  # equal values: deduped
        data["img"] = image
    if not data:
        data["o"] = [str(i) for i in range(n)]
    metas.append(q.put(data, partition_id=PARTITION))


def _described(meta: BatchMeta) -> list[tuple[int, dict[str, list[Any]]]]:
    return [(s.global_index, {n: f.to_list() for n, f in s.fields.items()}) for s in meta.samples]


def _check_values(q: SyncQueue, meta: BatchMeta) -> int:
    """Each sample's described dense fields against the value get_data reads; how many were checked."""
    checked = 0
    for k, sample in enumerate(meta.samples):
        one = meta.select_samples([k])
        for name, field in sample.fields.items():
            if field.kind not in ("ndarray", "tensor") or name == "img":  # deduped fields come back as lists
                continue
            value = q.get_data(one.select_fields([name]))[name]
            if isinstance(value, list):
                value = value[0][None]
            if field.kind == "ndarray":
                assert (value.dtype.str, tuple(value.shape[1:])) == (field.dtype, field.shape), (name, sample)
            else:
                assert (str(value.dtype), tuple(value.shape[1:])) == (f"torch.{field.dtype}", field.shape), name
            checked += 1
    return checked


def test_flushed_samples_are_described_as_the_rows_say(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    described: list[tuple[int, ...]] = []  # shapes of values described unread (a spy around the real function)
    real = lance_described.rows

    def spy(*args: Any) -> list[dict[str, Any]]:
        out = real(*args)
        described.extend(v.shape for row in out for v in row.values() if isinstance(v, lance_described.Stored))
        return out

    monkeypatch.setattr(lance_described, "rows", spy)
    kw: dict[str, Any] = {"storage_path": str(tmp_path / "data"), "dedup": ["img"], "num_buckets": rng.randint(1, 2)}
    metas: list[BatchMeta] = []
    with SyncQueue("mix", **kw) as q:
        _put_one(q, rng, metas, every=True)
        for _ in range(rng.randint(8, 16)):
            _put_one(q, rng, metas)
        q.flush()
    with SyncQueue("mix", **kw) as q:  # a reopen: nothing of the flushed rows is left in memory
        for _ in range(rng.randint(0, 6)):  # some still in the tail, patches of flushed samples among them
            _put_one(q, rng, metas)
        total = sum(m.size for m in metas)
        new = q.get_meta(None, total, "new", PARTITION)
        assert new.size == total
        with monkeypatch.context() as m:
            m.delattr(LanceBackend, "get_described")  # the engine reads the rows whole, as it did before
            old = q.get_meta(None, total, "old", PARTITION)
        assert any(-1 not in shape for shape in described), "no tensor value was described from its column"
        assert any(-1 in shape for shape in described), "no jagged value was described from its shape column"
        assert _described(new) == _described(old)
        assert _check_values(q, new) > 0


ARENA_BYTES = 32 * 1024 * 1024
BATCH_SAMPLES = 64  # x 4 MiB = 256 MiB, 8x the arena
SAMPLE_SHAPE = (1024, 1024)  # float32: 4 MiB a sample
# What the broker's RSS may grow by during the get besides the arena: the pieces in flight (2 x 64 MiB) and Lance's
# read buffers (measured: 186 MiB; describing by reading the rows whole, as before: 1,132 MiB, 4.4x the batch).
BROKER_GROWTH_BEYOND_ARENA_BYTES = 256 * 1024 * 1024


def _status_bytes(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def test_get_batch_of_a_flushed_big_batch_keeps_the_broker_near_the_arena(tmp_path: Path) -> None:
    data = np.empty((BATCH_SAMPLES, *SAMPLE_SHAPE), dtype=np.float32)
    data[:] = np.arange(BATCH_SAMPLES, dtype=np.float32)[:, None, None]
    args = ["--arena-bytes", str(ARENA_BYTES), "--max-message-bytes", str(64 * 1024 * 1024)]
    with running_broker(tmp_path, args) as b:
        assert b.proc is not None
        pid = b.proc.pid
        with SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
            q.put({"pixels": data, "step": list(range(BATCH_SAMPLES))}, partition_id="p")
            q.flush()
            time.sleep(0.5)  # the flush's own buffers are let go before the peak is reset
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM starts again from what the broker holds now
            before = _status_bytes(pid, "VmRSS")
            got, taken = q.get_batch(["pixels", "step"], BATCH_SAMPLES, "train", "p")
            peak = _status_bytes(pid, "VmHWM")
            print(f"broker RSS before the get {before >> 20} MiB, peak during it {peak >> 20} MiB")
            assert taken.size == BATCH_SAMPLES
            assert taken.samples[0].fields["pixels"].shape == SAMPLE_SHAPE
            np.testing.assert_array_equal(got["pixels"], data)
            assert got["step"] == list(range(BATCH_SAMPLES))
    limit = before + ARENA_BYTES + BROKER_GROWTH_BEYOND_ARENA_BYTES
    assert peak < limit, f"the broker's RSS peaked at {peak >> 20} MiB taking the batch (limit {limit >> 20} MiB)"
