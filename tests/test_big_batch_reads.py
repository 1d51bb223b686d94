"""Reading back a batch larger than the arena (issue 24 item 2): while its spool file exists, each dense field is
read straight from the file into one result array (``pieces.read_spooled``), in embedded and broker mode; a flush
that deletes the file during the read changes nothing (the open file is the hold); a broker killed with SIGKILL
mid-read neither stops the read nor loses the batch; a tcp client and a flushed batch take the pieces path; a
consumer killed with SIGKILL while it reads a flushed batch in pieces (one piece asked for ahead) leaves the broker
holding nothing and no /dev/shm file."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import SyncQueue
from persisting.client.connection import connection
from persisting.engine import Topic, flushing
from persisting.tensors import pieces
from persisting.tensors.arena import default_path
from persisting.tensors.meta import BatchMeta

from .broker_fixture import running_broker
from .test_big_batches import ARENA_BYTES, BIG_SAMPLES, BROKER_ARGS, big_batch, spool_files


class _Reads:
    """Counts the direct reads that found their files (a spy around the real function: nothing is faked)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.direct = 0
        real = pieces.read_spooled

        def spy(where: Any, n: int) -> Any:
            out = real(where, n)
            self.direct += out is not None
            return out

        monkeypatch.setattr(pieces, "read_spooled", spy)


def test_embedded_read_from_the_spool_file_survives_a_flush_mid_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pieces, "SPOOL_ABOVE_BYTES", ARENA_BYTES)
    # The test decides when the flush runs: no urgent flush after the put, no write-behind flush either.
    monkeypatch.setattr(Topic, "flush_soon", lambda self: None)
    monkeypatch.setattr(flushing, "WRITE_BEHIND_IDLE_SECONDS", 3600.0)
    monkeypatch.setattr(flushing, "WRITE_BEHIND_MAX_SECONDS", 3600.0)
    reads = _Reads(monkeypatch)
    data = big_batch(3)
    storage = tmp_path / "data"
    with SyncQueue("big", storage_path=storage) as q:
        meta = q.put({"pixels": data, "step": list(range(BIG_SAMPLES))}, partition_id="p")
        got = q.get_data(meta)
        assert reads.direct == 1, "the batch was not read from its spool file"
        np.testing.assert_array_equal(got["pixels"], data)
        assert got["step"] == list(range(BIG_SAMPLES))

        real_pread = pieces._pread_into
        flushed: list[list[Path]] = []

        def flush_first(fd: int, dest: np.ndarray, offset: int) -> None:
            if not flushed:
                q.flush()  # the flush writes the batch to Lance and deletes the file under the open read
                flushed.append(spool_files(storage))
            real_pread(fd, dest, offset)

        monkeypatch.setattr(pieces, "_pread_into", flush_first)
        got = q.get_data(meta.select_fields(["pixels"]))
        assert flushed == [[]], f"the flush did not delete the spool file: {flushed}"
        assert reads.direct == 2
        np.testing.assert_array_equal(got["pixels"], data)
        got = q.get_data(meta)  # the file is gone: from Lance, in pieces
        assert reads.direct == 2
        np.testing.assert_array_equal(got["pixels"], data)
        assert got["step"] == list(range(BIG_SAMPLES))


def test_broker_read_from_the_spool_file_then_from_lance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    reads = _Reads(monkeypatch)
    data = big_batch(5)
    with running_broker(tmp_path, BROKER_ARGS) as b, SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
        meta = q.put({"pixels": torch.from_numpy(data), "step": list(range(BIG_SAMPLES))}, partition_id="p")
        got = q.get_data(meta)  # right after the put: the background flush is still writing Lance
        assert reads.direct == 1, "the batch was not read from its spool file"
        assert isinstance(got["pixels"], torch.Tensor)
        np.testing.assert_array_equal(got["pixels"].numpy(), data)
        assert got["step"] == list(range(BIG_SAMPLES))
        q.flush()
        assert spool_files(b.storage) == []
        got = q.get_data(meta)
        assert reads.direct == 1  # the file is gone: from Lance, in pieces
        np.testing.assert_array_equal(got["pixels"].numpy(), data)


def test_broker_killed_mid_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _Reads(monkeypatch)
    data = big_batch(9)
    with running_broker(tmp_path, BROKER_ARGS) as b:
        with SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
            meta = q.put({"pixels": data}, partition_id="p")
            real_pread = pieces._pread_into
            killed: list[bool] = []

            def kill_first(fd: int, dest: np.ndarray, offset: int) -> None:
                if not killed:
                    b.kill()  # SIGKILL, between the broker's answer and the first byte read
                    killed.append(True)
                real_pread(fd, dest, offset)

            monkeypatch.setattr(pieces, "_pread_into", kill_first)
            got = q.get_data(meta)  # the files are on disk and open: the read completes
            assert killed and reads.direct == 1
            np.testing.assert_array_equal(got["pixels"], data)
            monkeypatch.setattr(pieces, "_pread_into", real_pread)
        b.start()  # replayed from the spool file its log frame names
        with SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
            np.testing.assert_array_equal(q.get_data(meta)["pixels"], data)
            q.flush()
        assert spool_files(b.storage) == []


def _read_again_and_again(address: str, meta: BatchMeta, first_done: Any) -> None:
    """A consumer process: reads the flushed batch whole, over and over, until it is killed."""
    with SyncQueue("big", broker=address) as q:
        while True:
            q.get_data(meta)
            first_done.set()


def test_consumer_killed_mid_read_from_lance_leaves_nothing_held(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    data = big_batch(seed % 1000)
    with running_broker(tmp_path, BROKER_ARGS) as b:
        with SyncQueue("big", storage_path=b.storage, broker=b.address) as q:
            meta = q.put({"pixels": data}, partition_id="p")
            q.flush()  # the spool file is gone: every read is the pieces path, from Lance
            ctx = multiprocessing.get_context("spawn")  # (Lance is not fork-safe)
            first_done = ctx.Event()
            consumer = ctx.Process(target=_read_again_and_again, args=(b.address, meta, first_done), daemon=True)
            consumer.start()
            try:
                assert first_done.wait(120), "the consumer never finished a read"
                time.sleep(random.Random(seed).uniform(0.0, 0.5))  # somewhere in a later read's pieces
                os.kill(consumer.pid, signal.SIGKILL)
            finally:
                consumer.join(30)
            assert consumer.exitcode == -signal.SIGKILL
            # The broker answered (to nobody) what the dead consumer asked for, and serves the next read whole.
            np.testing.assert_array_equal(q.get_data(meta)["pixels"], data)
            stats = asyncio.run(_arena_stats(b.address))
            assert stats["holds"] == 0 and stats["held_extents"] == 0 and stats["leased_extents"] == 0, stats
        assert b.stop() == 0
    assert not default_path(b.storage).exists(), "the arena's /dev/shm file was left"


async def _arena_stats(address: str) -> dict[str, Any]:
    stats: dict[str, Any] = (await connection(address).request("hello", {})).result["arena_stats"]
    return stats


def test_a_flushed_spooled_batch_is_never_encoded_into_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flush hands a spooled batch to Lance without encoding a row per sample to keep in memory (that cost the
    broker 4x the batch in RSS during the next read); reads after the flush get every value from Lance."""
    from persisting.engine import tail

    monkeypatch.setattr(pieces, "SPOOL_ABOVE_BYTES", ARENA_BYTES)
    encoded: list[int] = []
    real = tail.materialize

    def spy(other: list[dict[str, Any]], arena: Any) -> list[dict[str, Any]]:
        if arena is not None and arena.extent_id < 0:
            encoded.append(len(other))
        return real(other, arena)

    monkeypatch.setattr(tail, "materialize", spy)
    data = big_batch(5)
    with SyncQueue("big", storage_path=tmp_path / "data") as q:
        meta = q.put({"pixels": data, "step": list(range(BIG_SAMPLES))}, partition_id="p")
        q.flush()
        got = q.get_data(meta)
        np.testing.assert_array_equal(got["pixels"], data)
        assert got["step"] == list(range(BIG_SAMPLES))
        assert encoded == [], f"a spooled batch was encoded into rows ({encoded})"
