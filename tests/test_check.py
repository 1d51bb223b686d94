"""``persisting-broker check [--repair]`` (issue 37 item 3), run as the real command on stores the engine wrote:
healthy ones are reported well and left byte for byte as they were; each kind of damage it detects is named with
its topic and file, repaired where no acknowledged row is lost (then checked well, and read back exactly), and
stated as not repairable otherwise; a store a broker or an embedded process has open is refused."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pytest

from persisting import Queue, SyncQueue
from persisting.client import _loop
from persisting.engine.wal import frame_bounds, segment_files
from persisting.storage import lance_order
from persisting.storage.lance_columns import rewrite_name

from .broker_fixture import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("check_worker.py")
LEGACY = Path(__file__).with_name("fixtures") / "legacy_topic" / "legacy"


def check(storage: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "broker", "check", "--storage-path", str(storage), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout, done.stderr)
    return done


def files(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def line(out: str, *words: str) -> str:
    """The one line of ``out`` holding every word (a check names topic, file and problem on one line)."""
    found = [text for text in out.splitlines() if all(w in text for w in words)]
    assert len(found) == 1, f"no single line with {words} in:\n{out}"
    return found[0]


def records(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"id": i, "v": rng.random(), "s": "x" * rng.randint(0, 30)} for i in range(n)]


def write_healthy(store: Path, seed: int) -> None:
    """Records over two buckets compacted, tensor batches with takes and a clear, keys with tags, a patch and a
    cleared key: every path that leaves something on disk."""
    rng = np.random.default_rng(seed)
    options = {"compact_min_fragments": 2, "target_rows_per_fragment": 1000}

    async def main() -> None:
        async with Queue("records", storage_path=store, num_buckets=2, backend_options=options) as q:
            for k in range(6):
                await q.put_batch(records(seed + k, 10))
                await q.flush()
            await _loop.call(q._handle.opened.engine_topic.maintain())  # type: ignore[union-attr]  # compacts
            fragments = [b["fragments"] for b in (await q.stats())["buckets"]]
            assert max(fragments) < 6, fragments
        async with Queue("tensors", storage_path=store, num_buckets=1) as q:
            metas = [
                await q.put({"x": rng.random((4, 3), dtype=np.float32), "r": np.arange(4.0)}, partition_id="p")
                for _ in range(3)
            ]
            await q.get_meta(["x"], 2, "train", "p")
            await q.clear(metas[1].global_indexes, "p")
        async with Queue("keys", storage_path=store, num_buckets=1) as q:
            await q.kv_put(["a", "b", "c"], {"z": np.ones((3, 2))}, "kv", tags=[{"t": 1}, None, {"t": 3}])
            await q.kv_put(["a"], {"w": np.zeros((1, 2))}, "kv")  # a patch of an existing key
            await q.kv_clear(["b"], "kv")

    asyncio.run(main())
    shutil.copytree(LEGACY, store / "legacy")  # a topic written by persisting 0.1


def test_healthy_stores_are_well_and_left_as_they_were(store: Path, seed: int) -> None:
    write_healthy(store, seed)
    before = files(store)
    done = check(store)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("records", "tensors", "keys", "legacy"):
        assert line(done.stdout, f"topic {name!r}", "): ok")
    assert "PROBLEM" not in done.stdout and "all well" in done.stdout
    assert files(store) == before, "check changed the store"
    with SyncQueue("records", storage_path=store, num_buckets=2) as q:
        assert sorted(r["id"] for r in q.get(limit=1000)) == sorted(list(range(10)) * 6)


def _reorder(bucket: Path) -> None:
    """Move the second fragment to the end, as a compaction committed by pylance 14 does."""
    ds = lance.dataset(str(bucket))
    f = ds.get_fragments()[1].metadata
    lance_order.rewrite(ds, [f], [lance_order.moved(f)])  # a Rewrite's new fragments go last


def _flip(segment: Path, frame: int) -> None:
    """Flip one byte inside frame number ``frame`` of a log segment."""
    data = bytearray(segment.read_bytes())
    pos = 0
    for _ in range(frame):
        pos = frame_bounds(bytes(data), pos)[2]  # type: ignore[index]
    data[pos + 30] ^= 0xFF
    segment.write_bytes(bytes(data))


def _segment(store: Path, topic: str) -> Path:
    ((_, segment),) = segment_files(store / topic / "wal")
    return segment


DAMAGED = ("order", "walflip", "taken", "leftover", "manifest", "rewrite")


def test_damage_is_named_repaired_and_read_back(store: Path, seed: int) -> None:
    for k, name in enumerate(DAMAGED):
        with SyncQueue(name, storage_path=store, num_buckets=1) as q:
            for i in range(4):
                q.put_batch(records(seed + 10 * k + i, 3))
                q.flush()
            if name == "taken":
                q.clear([0], "default")
                q.get_meta(None, 2, "t")
    _reorder(store / "order" / "bucket-0.lance")
    _flip(_segment(store, "walflip"), 1)
    log = store / "taken" / "consumption.log"
    log.write_bytes(log.read_bytes()[:-3])  # the last record (the take) cut
    leftover = store / "leftover"
    (leftover / "state.json.tmp").write_text("{}")
    (leftover / "spool").mkdir()
    (leftover / "spool" / f"{2**30}-{'0' * 32}.part").write_bytes(b"x" * 10)  # a writer that is gone
    data = leftover / "bucket-0.lance" / "data"
    shutil.copy(sorted(data.iterdir())[0], data / f"{'1' * 24}{'ab' * 12}00.lance")  # a file no version names
    bucket = store / "manifest" / "bucket-0.lance"
    (bucket / "_versions" / f"{2**64 - 1 - (lance.dataset(str(bucket)).version + 1)}.manifest").touch()
    lance.dataset(str(store / "rewrite" / "bucket-0.lance")).add_columns({rewrite_name("v"): "v"})  # a kill

    found = check(store)
    assert found.returncode == 1
    out = found.stdout
    assert line(out, "PROBLEM", "topic 'order'", "bucket-0.lance:", "fragments out of index order", "--repair fixes")
    assert line(out, "PROBLEM", "topic 'walflip'", f"wal/{_segment(store, 'walflip').name}:", "frame of rows 3..5",
                "fails its checksum", "--repair fixes")  # fmt: skip
    assert line(out, "PROBLEM", "topic 'taken'", "consumption.log:", "is cut or fails its checksum", "--repair fixes")
    assert line(out, "topic 'leftover'", "state.json.tmp:", "temporary file")
    assert line(out, "topic 'leftover'", "spool/", ".part:", "writer (process 1073741824) is gone")
    assert line(out, "topic 'leftover'", "bucket-0.lance:", "1 data file(s) no version refers to")
    assert line(out, "PROBLEM", "topic 'manifest'", "bucket-0.lance:", "1 empty manifest(s)", "--repair fixes")
    assert line(out, "PROBLEM", "topic 'rewrite'", "bucket-0.lance:", "rewrite of column(s) v was interrupted")
    assert "--repair cannot fix this" not in out

    repaired = check(store, "--repair")
    assert repaired.returncode == 0, repaired.stdout
    assert line(repaired.stdout, "repaired", "topic 'order'", "index order")
    assert line(repaired.stdout, "repaired", "topic 'walflip'", "took 1 damaged frame(s) out")
    assert check(store).returncode == 0
    for k, name in enumerate(DAMAGED):
        want = [r for i in range(4) for r in records(seed + 10 * k + i, 3)]
        with SyncQueue(name, storage_path=store, num_buckets=1) as q:
            assert q.get(limit=100) == (want[1:] if name == "taken" else want), name  # (sample 0 was cleared)


def test_damage_that_cannot_be_repaired_is_stated(store: Path) -> None:
    for _attempt in range(3):  # the worker exits before the spool file's flush lands, nearly always
        shutil.rmtree(store, ignore_errors=True)
        subprocess.run([sys.executable, str(WORKER), str(store)], cwd=ROOT, check=True, timeout=120)
        spools = list((store / "nospool" / "spool").glob("*.spool"))
        if spools:
            break
    else:
        pytest.fail("the worker's spooled batch was flushed before it exited, three times")
    with SyncQueue("foreign", storage_path=store) as q:
        q.put({"id": 1})
    assert check(store).returncode == 0  # what a kill -9 leaves is a state the next open recovers
    spools[0].unlink()
    _flip(_segment(store, "torn"), 1)  # the frame of rows 5..7, not in Lance
    meta = json.loads((store / "foreign" / "topic.json").read_text())
    (store / "foreign" / "topic.json").write_text(json.dumps({**meta, "format": 2}))
    before = files(store)

    found = check(store, "--repair")
    assert found.returncode == 1
    out = found.stdout
    assert line(out, "PROBLEM", "topic 'nospool'", f"spool/{spools[0].name}:", "is gone", "rows 5..8",
                "--repair cannot fix this")  # fmt: skip
    assert line(out, "PROBLEM", "topic 'torn'", f"wal/{_segment(store, 'torn').name}:", "frame of rows 5..7",
                "not in Lance", "--repair cannot fix this")  # fmt: skip
    assert line(out, "PROBLEM", "topic 'foreign'", "topic.json:", "format 2", "--repair cannot fix this")
    assert "repaired" not in out
    assert files(store) == before, "a repair changed what it could not fix"


def test_a_running_broker_or_an_open_topic_is_refused(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    with SyncQueue("live", broker=broker.address) as q:
        q.put({"id": 1})
    refused = check(broker.storage)
    assert refused.returncode == 1
    assert f"a broker serves {broker.storage} (process {broker.proc.pid} holds" in refused.stderr
    assert "stop it first" in refused.stderr
    assert broker.stop() == 0
    with SyncQueue("live", storage_path=broker.storage):
        busy = check(broker.storage, "--topic", "live")
        assert busy.returncode == 1
        assert line(busy.stdout, "topic 'live'", f"not checked: process {os.getpid()} holds", "close it first")
    done = check(broker.storage, "--topic", "live")
    assert done.returncode == 0 and line(done.stdout, "topic 'live'", "): ok")
