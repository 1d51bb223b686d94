"""kill -9 at random moments, then reopen: every acknowledged put is there exactly once, in order."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from persisting import Queue

WORKER = Path(__file__).with_name("crash_worker.py")


def _spawn(path: Path, topic: str, durability: str, batch_size: int, seed: int, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(path), topic, durability, str(batch_size), str(seed), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,  # unbuffered: readline() must not swallow ACK lines that communicate() then misses
    )


def _kill_after(proc: subprocess.Popen[bytes], delay: float) -> bytes:
    """Let the worker run ``delay`` seconds after it opened the queue, SIGKILL it, return all it printed."""
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(b"OPEN"), (first, proc.stderr.read() if proc.stderr else b"")
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-3000:]
    return first + out


def _stored(path: Path, topic: str) -> list[dict[str, object]]:
    async def main() -> list[dict[str, object]]:
        async with Queue(topic, storage_path=path, num_buckets=3) as q:
            rows = await q.get(limit=10**9)
            assert len(rows) == len(q)
            return rows

    return asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("durability", "batch_size"),
    [("sync", 50), ("sync", 100_000), ("process", 37)],
    ids=["sync-flushing", "sync-log-only", "process"],
)
def test_serial_producer_killed_repeatedly(tmp_path: Path, seed: int, durability: str, batch_size: int) -> None:
    rng = random.Random(seed)
    acked_upto = 0
    for round_no in range(6):
        proc = _spawn(tmp_path, "t", durability, batch_size, rng.randrange(2**31), "serial")
        out = _kill_after(proc, rng.uniform(0.05, 1.0))
        for line in out.decode().splitlines():
            if line.startswith("ACK"):
                _, a, b = line.split()
                assert int(a) <= acked_upto, f"round {round_no}: {line} does not continue from {acked_upto}"
                acked_upto = max(acked_upto, int(b))
        ids = [r["id"] for r in _stored(tmp_path, "t")]
        # exactly once and in order: the stored ids are 0..m-1 with every acknowledged id among them
        assert ids == list(range(len(ids))), f"round {round_no}: ids not a gap-free sequence"
        assert len(ids) >= acked_upto, f"round {round_no}: lost acknowledged puts ({len(ids)} < {acked_upto})"
        print(f"round {round_no}: acked up to {acked_upto}, stored {len(ids)}")
        acked_upto = len(ids)
    assert acked_upto > 0


@pytest.mark.slow
def test_concurrent_producers_killed_repeatedly(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    acked: set[str] = set()
    for _ in range(4):
        proc = _spawn(tmp_path, "c", "sync", rng.choice([20, 500]), rng.randrange(2**31), "concurrent")
        out = _kill_after(proc, rng.uniform(0.1, 1.0))
        for line in out.decode().splitlines():
            if line.startswith("ACKS "):
                acked.update(line.split()[1:])
        rows = _stored(tmp_path, "c")
        ids = [str(r["id"]) for r in rows]
        assert len(ids) == len(set(ids)), "a record was stored twice"
        missing = acked - set(ids)
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
        per_writer: dict[str, list[int]] = {}
        for x in ids:  # each coroutine's records keep their order
            run, w, k = x.split(":")
            per_writer.setdefault(f"{run}:{w}", []).append(int(k))
        assert all(ks == sorted(ks) for ks in per_writer.values())
        print(f"acked {len(acked)} stored {len(ids)}")
    assert acked


def _copy_log_state(topic_dir: Path, to: Path) -> None:
    to.mkdir()
    shutil.copytree(topic_dir / "wal", to / "wal")
    for name in ("state.json", "schema.json"):
        if (topic_dir / name).exists():
            shutil.copy2(topic_dir / name, to / name)


def _restore_log_state(saved: Path, topic_dir: Path) -> None:
    shutil.rmtree(topic_dir / "wal")
    shutil.copytree(saved / "wal", topic_dir / "wal")
    for name in ("state.json", "schema.json"):
        if (saved / name).exists():
            shutil.copy2(saved / name, topic_dir / name)
        else:  # it did not exist yet at that moment
            (topic_dir / name).unlink(missing_ok=True)


@pytest.mark.parametrize("manifest_lost", [False, True], ids=["commit-landed-unrecorded", "zero-byte-manifest"])
def test_replay_after_an_interrupted_flush_stores_once(tmp_path: Path, manifest_lost: bool) -> None:
    """A flush whose Lance commit landed (or whose manifest came back empty after a power loss) while the log
    still holds its rows: reopening stores every row exactly once."""
    store = tmp_path / "data"
    topic_dir = store / "f"

    async def write() -> None:
        q = Queue("f", storage_path=store, num_buckets=2, batch_size=10**6)
        await q.put_batch([{"id": i} for i in range(100)])
        await q.flush()
        await q.put_batch([{"id": i} for i in range(100, 150)])
        _copy_log_state(topic_dir, tmp_path / "saved")  # the log as it was before the second flush
        await q.flush()
        await q.aclose()

    asyncio.run(write())
    _restore_log_state(tmp_path / "saved", topic_dir)
    if manifest_lost:
        for bucket in topic_dir.glob("bucket-*.lance"):
            newest = min((bucket / "_versions").glob("*.manifest"))  # names count down: newest sorts first
            newest.write_bytes(b"")
    ids = [r["id"] for r in _stored_nb(store, "f", 2)]
    assert ids == list(range(150))
    ids = [r["id"] for r in _stored_nb(store, "f", 2)]  # and again, after the recovery flush
    assert ids == list(range(150))


def _stored_nb(path: Path, topic: str, nb: int) -> list[dict[str, object]]:
    async def main() -> list[dict[str, object]]:
        async with Queue(topic, storage_path=path, num_buckets=nb) as q:
            return await q.get(limit=10**9)

    return asyncio.run(main())


def test_torn_log_tail_is_cut_and_earlier_records_survive(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "data"
    # A process that puts 10 records and dies without closing (os._exit): the log is all there is.
    code = (
        "import asyncio, os\nfrom persisting import Queue\n"
        "async def m():\n"
        f"    q = Queue('torn', storage_path={str(store)!r}, batch_size=10**6)\n"
        "    for i in range(10):\n"
        "        await q.put({'id': i})\n"
        "    os._exit(0)\n"
        "asyncio.run(m())\n"
    )
    subprocess.run([sys.executable, "-c", code], timeout=60, check=True)
    seg = max((store / "torn" / "wal").glob("*.log"), key=lambda p: p.stat().st_size)
    with open(seg, "ab") as f:
        f.write(b"PWAL\x00\x01garbage-from-a-torn-write")
    size_with_garbage = seg.stat().st_size
    assert [r["id"] for r in _stored_nb(store, "torn", 4)] == list(range(10))
    assert "torn or corrupt frame" in caplog.text
    assert not seg.exists() or seg.stat().st_size < size_with_garbage


@pytest.mark.parametrize("left", ["data-only", "empty-manifest"])
def test_a_bucket_whose_first_commit_never_landed_is_started_afresh(tmp_path: Path, left: str) -> None:
    """A kill during a bucket's first Lance write leaves a folder without a committed manifest (data files, or a
    manifest that came back empty): the topic still opens, and the log's rows are stored exactly once."""
    store = tmp_path / "data"
    code = (
        "import asyncio, os\nfrom persisting import Queue\n"
        "async def m():\n"
        f"    q = Queue('first', storage_path={str(store)!r}, num_buckets=2, batch_size=10**6)\n"
        "    await q.put_batch([{'id': i} for i in range(20)])\n"
        "    os._exit(0)\n"
        "asyncio.run(m())\n"
    )
    subprocess.run([sys.executable, "-c", code], timeout=60, check=True)
    bucket = store / "first" / "bucket-1.lance"
    (bucket / "data").mkdir(parents=True)
    (bucket / "data" / "written-before-the-kill.lance").write_bytes(b"\x00" * 4096)
    if left == "empty-manifest":
        (bucket / "_versions").mkdir()
        (bucket / "_versions" / "18446744073709551614.manifest").write_bytes(b"")
    assert sorted(r["id"] for r in _stored_nb(store, "first", 2)) == list(range(20))
    assert sorted(r["id"] for r in _stored_nb(store, "first", 2)) == list(range(20))  # and after its flush


def test_second_process_gets_a_clear_lock_error(tmp_path: Path) -> None:
    store = tmp_path / "data"
    code = (
        "import asyncio\nfrom persisting import Queue, TopicLockedError\n"
        "async def m():\n"
        "    try:\n"
        f"        await Queue('locked', storage_path={str(store)!r}).open()\n"
        "    except TopicLockedError as e:\n"
        "        print('LOCKED', e)\n"
        "asyncio.run(m())\n"
    )

    async def main() -> None:
        async with Queue("locked", storage_path=store) as q:
            await q.put({"id": 1})
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
            assert out.stdout.startswith("LOCKED") and str(os.getpid()) in out.stdout, out.stderr

    asyncio.run(main())
