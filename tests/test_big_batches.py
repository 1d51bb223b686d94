"""Batches larger than the arena (issue 24 item 2): stored through a spool file, read back in pieces, exactly;
never refused for their size; no half batch after a kill -9; no arena space, /dev/shm file or spool file left."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from persisting import SyncQueue
from persisting.tensors import pieces
from persisting.tensors.arena import default_path

from .broker_fixture import running_broker

ARENA_BYTES = 32 * 1024 * 1024  # a small arena keeps the tests fast; the bench runs 2 GiB through 256 MiB
MESSAGE_BYTES = 64 * 1024 * 1024  # and a small message limit: a batch larger than both is never refused
BROKER_ARGS = ["--arena-bytes", str(ARENA_BYTES), "--max-message-bytes", str(MESSAGE_BYTES)]
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
    with running_broker(tmp_path, BROKER_ARGS) as b:
        with SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
            import torch

            meta = q.put({"pixels": torch.from_numpy(data), "step": list(range(BIG_SAMPLES))}, partition_id="p")
            got, taken = q.get_batch(["pixels", "step"], BIG_SAMPLES, "train", "p")
            assert taken.global_indexes == meta.global_indexes
            assert isinstance(got["pixels"], torch.Tensor)
            np.testing.assert_array_equal(got["pixels"].numpy(), data)
            assert got["step"] == list(range(BIG_SAMPLES))
            q.flush()
        # the broker deletes the spool file once the flush that wrote its rows is recorded; under load that can
        # land a moment after flush() answered, so wait for it (bounded) rather than race it
        deadline = time.monotonic() + 30.0
        while spool_files(b.storage) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spool_files(b.storage) == []
    assert not default_path(b.storage).exists()


KILL_SAMPLES = 12  # x 4 MiB = 48 MiB: 1.5x the arena, a few seconds a batch


def _worker(storage: Path, address: str, count: int, seed: int) -> subprocess.Popen[str]:
    args = [str(storage), address, str(KILL_SAMPLES), str(count), str(seed)]
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, text=True)


def _lines_until(proc: subprocess.Popen[str], word: str, deadline_s: float = 120.0) -> list[str]:
    assert proc.stdout is not None
    lines = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if line.startswith(word):
            return lines
    raise AssertionError(f"no {word!r} from the worker: {lines}")


def _check_batches(q: SyncQueue, acked: dict[int, int]) -> None:
    """Every acknowledged batch is there once, whole and exact; nothing else is (no half batch)."""
    parts = q.partitions()
    samples = parts.get("p", {}).get("samples", 0) if parts else 0
    assert samples % KILL_SAMPLES == 0, f"{samples} samples: a half batch is visible"
    meta = q.get_meta(["pixels", "k"], samples, "check", "p") if samples else None
    seen: dict[int, list[int]] = {}
    if meta is not None and meta.size:
        data = q.get_data(meta)
        for row, (k, index) in enumerate(zip(data["k"], meta.global_indexes, strict=True)):
            seen.setdefault(k, []).append(index)
            np.testing.assert_array_equal(data["pixels"][row], big_batch(k, KILL_SAMPLES)[len(seen[k]) - 1])
    for k, first in acked.items():
        assert seen.get(k) == list(range(first, first + KILL_SAMPLES)), f"acknowledged batch {k} is not there once"
    assert all(len(v) == KILL_SAMPLES for v in seen.values()), f"a batch is there more than once or in part: {seen}"


def _acks(lines: list[str]) -> dict[int, int]:
    return {int(w[1]): int(w[2]) for w in (line.split() for line in lines) if w[0] == "ACK"}


@pytest.mark.parametrize("mode", ["embedded", "broker"])
def test_producer_killed_mid_write_leaves_no_half_batch(
    tmp_path: Path, seed: int, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    with running_broker(tmp_path, BROKER_ARGS) as b:
        address = b.address if mode == "broker" else "-"
        storage = b.storage if mode == "broker" else tmp_path / "embedded"
        proc = _worker(storage, address, 3, seed)
        lines = _lines_until(proc, "WRITING 1")  # batch 0 stored; now batch 1 is being written
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        acked = _acks(lines + out.splitlines())
        assert seed in acked
        with SyncQueue("big", storage_path=storage, broker=None if mode == "embedded" else address) as q:
            monkeypatch.setattr(pieces, "SPOOL_ABOVE_BYTES", ARENA_BYTES)  # restored after: later tests' reads
            _check_batches(q, acked)
            q.put({"pixels": big_batch(seed + 99, KILL_SAMPLES)}, partition_id="other")  # sweeps dead writers' files
            q.flush()  # a stored batch's own spool file goes once the backends hold it
        assert spool_files(storage) == [], "a killed producer's spool file was left"
        if mode == "broker":
            status = subprocess.run(
                [sys.executable, "-m", "broker", "status", "--socket", address, "--json"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip

            arena = json.loads(status.stdout)["arena"]
            assert arena["leased_extents"] == 0 and arena["holds"] == 0, arena
        if mode == "embedded":
            assert not default_path(storage).exists(), "embedded mode made a shared-memory file"


def test_broker_killed_mid_write_keeps_every_acknowledged_batch_once(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    with running_broker(tmp_path, BROKER_ARGS) as b:
        acked: dict[int, int] = {}
        for round_ in range(2):
            proc = _worker(b.storage, b.address, 3, seed + 10 * round_)
            lines = _lines_until(proc, "WRITING 1")
            time.sleep(rng.uniform(0.0, 1.5))
            b.kill()
            b.start()  # the producer's put in flight retries against the new broker (same idempotency key)
            out, _ = proc.communicate(timeout=120)
            print(f"round {round_}: {[*lines, *out.splitlines()]}")
            acked.update(_acks(lines + out.splitlines()))
        with SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
            _check_batches(q, acked)
        assert spool_files(b.storage) == []
