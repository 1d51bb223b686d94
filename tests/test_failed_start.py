"""Issue 37 (5): a broker start that cannot re-adopt what a killed broker left gives back the shared memory it cannot
use, names it in its log, and never loses an acknowledged payload (broker/kept.py says how).

Real everything: a broker subprocess, its segment files in a private shared-memory folder, SIGKILL, a topic
damaged on disk between the kill and the restart (its ``topic.json`` names a backend this broker does not run: a
state no fix of the engine repairs at open), then repaired.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from persisting import PersistingError, SyncQueue

from .broker_fixture import BrokerProcess, make_broker
from .segment_worker import check, columns

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
GOOD, BAD = "good", "bad"


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A shared-memory folder of this test alone: what is in it is this test's broker's."""
    path = Path(tempfile.mkdtemp(prefix="pfs-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _read_back(address: str, topic: str, sizes: dict[int, int], task: str) -> None:
    """Every batch of ``sizes`` (seed -> samples) is in ``topic`` once, whole, byte for byte; nothing else is."""
    with SyncQueue(topic, broker=address) as q:
        total = q.partitions().get("p", {}).get("samples", 0)
        assert total == sum(sizes.values()), f"{topic}: {total} samples, {sum(sizes.values())} acknowledged"
        meta = q.get_meta(["x", "k", "j"], total, task, "p")
        assert meta.size == total, f"{topic}: {total - meta.size} samples not readable (their tensors lost?)"
        data = q.get_data(meta)
        rows = sorted(zip(data["k"], data["j"], strict=True))
        assert rows == sorted((k, j) for k, n in sizes.items() for j in range(n)), f"{topic}: rows differ"
        assert check(data), f"{topic}: bytes differ"
        del data


def test_a_start_that_cannot_open_a_topic_keeps_its_payloads_and_gives_the_shared_memory_back(
    tmp_path: Path, seed: int, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERSISTING_WRITE_BEHIND_IDLE", "600")  # acknowledged batches stay in shared memory only
    monkeypatch.setenv("PERSISTING_WRITE_BEHIND_MAX", "600")
    b: BrokerProcess = make_broker(tmp_path)
    b.extra_args = ["--arena-bytes", str(8 * MiB), "--shm-budget", str(256 * MiB), "--shm-dir", str(shm_dir)]
    b.log_path = tmp_path / "broker.log"
    sizes = {t: {seed % 1000 + 10 * i + k: n for k, n in enumerate((2, 1, 10))} for i, t in enumerate((GOOD, BAD))}
    try:
        b.start()
        for topic, batches in sizes.items():
            with SyncQueue(topic, broker=b.address) as q:
                for k, n in batches.items():
                    q.put(columns(k, n), partition_id="p")  # 10 MiB: a segment of its own beyond the first
        b.kill()
        left = sorted(shm_dir.iterdir())
        assert len(left) >= 2, f"the killed broker left {left}: no segment beyond the first"
        meta_file = b.storage / BAD / "topic.json"
        stored = meta_file.read_text()
        meta_file.write_text(json.dumps({**json.loads(stored), "backend": "ForeignBackend"}))

        # 1. The payloads cannot be kept (a file stands where their folder goes): the start fails, and leaves the
        # killed broker's files for the next start, naming each one.
        (b.storage / "broker.kept").write_text("in the way")
        with pytest.raises(AssertionError, match="did not start"):
            b.start()
        assert b.proc is not None and b.proc.wait(timeout=30) != 0
        log = b.log_path.read_text()
        assert sorted(shm_dir.iterdir()) == left, "a failed start took files it could not keep"
        assert all(str(path) in log for path in left), f"the files left are not named in the log: {log[-3000:]}"

        # 2. It can: the start serves, the killed broker's files are gone (each named), the bad topic's payloads
        # are on disk, the good topic has all of its own.
        (b.storage / "broker.kept").unlink()
        b.start()
        log = b.log_path.read_text()[len(log) :]
        given_back = [line for line in log.splitlines() if "gave back the shared memory" in line]
        assert len(given_back) == 1 and all(f"{path} (" in given_back[0] for path in left), log[-3000:]
        assert f"topic {BAD!r} could not be opened" in log, log[-3000:]
        now = sorted(shm_dir.iterdir())
        assert len(now) == 1 and now[0] in left, f"files in the shm folder after the start: {now}"  # the new arena
        kept = json.loads(next((b.storage / "broker.kept").glob("*/kept.json")).read_text())
        assert kept["topics"] == [BAD], kept
        _read_back(b.address, GOOD, sizes[GOOD], "first")
        with pytest.raises(PersistingError, match="ForeignBackend"), SyncQueue(BAD, broker=b.address) as q:
            len(q)
        assert b.stop() == 0 and list(shm_dir.iterdir()) == [], "a clean stop left shared memory"

        # 3. Repaired: the next start re-adopts the kept payloads, every acknowledged batch is there once, exact.
        meta_file.write_text(stored)
        b.start()
        assert not (b.storage / "broker.kept").exists(), "the kept payloads outlived their re-adoption"
        _read_back(b.address, BAD, sizes[BAD], "second")
        _read_back(b.address, GOOD, sizes[GOOD], "second")
        assert b.stop() == 0 and list(shm_dir.iterdir()) == [], "a clean stop left shared memory"
    finally:
        b.ensure_dead()
