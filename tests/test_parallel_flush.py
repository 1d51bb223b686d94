"""Appends go to Lance through several encoders (one fragment each, one commit); compaction and cleanup run beside
flushes, not in their way; kill -9 during parallel flushes loses or doubles nothing acknowledged."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.fragment import write_fragments

from persisting import Queue
from persisting.errors import ConfigError
from persisting.storage import LanceBackend, lance_compaction, lance_parallel

WORKER = Path(__file__).with_name("parallel_flush_worker.py")


def _data_files(bucket: Path) -> set[str]:
    return {p.name for p in (bucket / "data").iterdir() if not p.name.startswith(".tmp")}


def _referenced(bucket: Path) -> set[str]:
    """The data files some version on disk refers to (old versions stay for ``retain_seconds``)."""
    versions = [lance.dataset(str(bucket), version=v["version"]) for v in lance.dataset(str(bucket)).versions()]
    return {Path(f.path).name for ds in versions for frag in ds.get_fragments() for f in frag.data_files()}


def test_an_append_goes_through_several_encoders_in_one_commit(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(lance_parallel, "MIN_ENCODER_BYTES", 64 * 1024)
    x = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)  # 1 MiB: 4 pieces of 256 KiB

    async def main() -> None:
        options = {"encoders": 4}
        async with Queue("t", storage_path=tmp_path, num_buckets=1, backend_options=options) as q:
            await q.put({"x": x[:1]}, partition_id="p")
            await q.flush()  # creates the dataset (one stream)
            before = lance.dataset(str(tmp_path / "t" / "bucket-0.lance"))
            await q.put({"x": x[1:]}, partition_id="p")
            await q.flush()
            after = lance.dataset(str(tmp_path / "t" / "bucket-0.lance"))
            assert after.version == before.version + 1  # one commit
            assert len(after.get_fragments()) == len(before.get_fragments()) + 4  # four encoders, one fragment each
            rows = await q.get(limit=1000)
            assert np.array_equal(np.stack([r["x"] for r in rows]), x)  # in order

    asyncio.run(main())


def test_encoders_setting_is_checked(tmp_path: Path, monkeypatch: Any) -> None:
    with pytest.raises(ConfigError, match="encoders must be an int >= 1"):
        LanceBackend(0, str(tmp_path), encoders=0)
    monkeypatch.setenv(lance_parallel.ENCODERS_ENV, "many")
    with pytest.raises(ConfigError, match="PERSISTING_LANCE_ENCODERS must be an int >= 1"):
        lance_parallel.default_encoders()
    monkeypatch.setenv(lance_parallel.ENCODERS_ENV, "3")
    assert lance_parallel.default_encoders() == 3 == LanceBackend(0, str(tmp_path)).encoders


def test_fragments_of_an_append_that_never_committed_are_removed_at_open(tmp_path: Path) -> None:
    async def put(n: int, start: int) -> None:
        async with Queue("t", storage_path=tmp_path, num_buckets=1) as q:
            await q.put_batch([{"id": start + i, "v": "x" * 100} for i in range(n)])

    asyncio.run(put(100, 0))
    bucket = tmp_path / "t" / "bucket-0.lance"
    # What a kill between the encoders' writes and the commit leaves: fragments no version refers to.
    ds = lance.dataset(str(bucket))
    orphan = pa.table({"id": pa.array(range(100, 200), pa.int64()), "v": pa.array(["y"] * 100, pa.large_string())})
    write_fragments(orphan, ds)
    assert _data_files(bucket) > _referenced(bucket)
    asyncio.run(put(10, 100))
    assert _data_files(bucket) == _referenced(bucket)

    async def read() -> list[dict[str, Any]]:
        async with Queue("t", storage_path=tmp_path, num_buckets=1) as q:
            return await q.get(limit=1000)

    rows = asyncio.run(read())
    assert [r["id"] for r in rows] == list(range(110))
    assert all(r["v"] == "x" * 100 for r in rows)


class HeldMaintenance(LanceBackend):
    """Maintenance whose worker-thread part waits until the test lets it go on."""

    started = threading.Event()
    release = threading.Event()

    def _maintain(self, ds: Any, small: int, cleanup: bool) -> Any:
        HeldMaintenance.started.set()
        HeldMaintenance.release.wait(30)
        return super()._maintain(ds, small, cleanup)


def test_a_flush_does_not_wait_for_compaction(tmp_path: Path) -> None:
    async def main() -> None:
        b = HeldMaintenance(0, str(tmp_path), compact_min_fragments=2, retain_seconds=0.0, cleanup_interval_seconds=0)
        for i in range(4):
            await b.put_batch([{"id": i * 10 + k} for k in range(10)])
            await b.flush()
        maintenance = asyncio.ensure_future(b.maintain())
        while not HeldMaintenance.started.is_set():
            await asyncio.sleep(0.01)
        try:
            # Compaction is under way (held): an append and a read still go through.
            await asyncio.wait_for(b.put_batch([{"id": 40 + k} for k in range(10)]), 20)
            await asyncio.wait_for(b.flush(), 20)
            assert [r["id"] for r in await b.get(100, 0)] == list(range(50))
        finally:
            HeldMaintenance.release.set()
            await maintenance
        # That compaction was made before the append: committing it would put rows 0-39 after 40-49 (Lance puts
        # rewritten fragments last), so it was dropped, files and all.
        bucket = tmp_path / "bucket-0.lance"
        assert (await b.stats())["fragments"] == 5
        assert [r["id"] for r in await b.get(100, 0)] == list(range(50))
        assert _data_files(bucket) == _referenced(bucket)
        await b.maintain()  # nothing appended meanwhile: this one lands
        assert (await b.stats())["fragments"] == 1
        await b.put_batch([{"id": 50}])
        await b.flush()
        reopened = LanceBackend(0, str(tmp_path))
        assert [r["id"] for r in await reopened.get(100, 0)] == list(range(51))

    asyncio.run(main())


@pytest.mark.slow
def test_parallel_flushes_killed_at_random_moments(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    acked = 0
    for round_no in range(5):
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(tmp_path), str(rng.randrange(2**31))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith(b"OPEN"), (first, proc.stderr.read() if proc.stderr else b"")
        time.sleep(rng.uniform(0.2, 1.5))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err.decode()[-3000:]
        for line in out.decode().splitlines():
            if line.startswith("ACK"):
                acked = max(acked, int(line.split()[2]))

        async def stored() -> list[dict[str, Any]]:
            async with Queue("p", storage_path=tmp_path, num_buckets=2) as q:
                return await q.get(limit=10**9)

        rows = asyncio.run(stored())
        ids = [r["id"] for r in rows]
        assert ids == list(range(len(ids))), f"round {round_no}: ids stored twice or out of order"
        assert len(ids) >= acked, f"round {round_no}: lost acknowledged puts ({len(ids)} < {acked})"
        for r in rows:  # each row's payload is its own
            assert r["x"].shape == (1024,) and float(r["x"][0]) == r["id"] == float(r["x"][-1])
        for bucket in (tmp_path / "p").glob("bucket-*.lance"):
            assert _data_files(bucket) == _referenced(bucket), f"round {round_no}: unreferenced files left"
        print(f"round {round_no}: acked {acked}, stored {len(ids)}")
        acked = len(ids)
    assert acked > 0


def test_compaction_leaves_fragments_of_big_rows_alone(tmp_path: Path, monkeypatch: Any) -> None:
    # Fragments of at least COMPACT_BELOW_BYTES are never rewritten (a tensor stream must not write its payload
    # twice), however few rows they hold; the small ones are merged as before.
    monkeypatch.setattr(lance_compaction, "COMPACT_BELOW_BYTES", 256 * 1024)

    async def main() -> None:
        b = LanceBackend(0, str(tmp_path), compact_min_fragments=2, cleanup_interval_seconds=3600)
        for i in range(3):  # 3 fragments of 64 rows x 8 KiB = 512 KiB
            await b.put_batch([{"id": i * 64 + k, "p": os.urandom(8192)} for k in range(64)])
            await b.flush()
        for i in range(3):  # 3 fragments of 4 rows x 8 KiB = 32 KiB
            await b.put_batch([{"id": 192 + i * 4 + k, "p": os.urandom(8192)} for k in range(4)])
            await b.flush()
        big = [f.fragment_id for f in lance.dataset(b.uri).get_fragments()][:3]
        await b.maintain()
        after = lance.dataset(b.uri).get_fragments()
        assert [f.fragment_id for f in after][:3] == big  # untouched
        assert [f.count_rows() for f in after] == [64, 64, 64, 12]  # the small ones merged
        assert [r["id"] for r in await b.get(1000, 0)] == list(range(204))

    asyncio.run(main())
