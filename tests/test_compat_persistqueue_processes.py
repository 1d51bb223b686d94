"""persist-queue's API across processes through a real broker: 2 producers, 2 consumers (get + ack) on one
SQLiteAckQueue path, one consumer SIGKILLed while it holds an item unacknowledged: every record is acked exactly
once and none is lost (persist-queue itself hands records out twice and loses some here)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import persisting.compat.persistqueue as persistqueue

from .broker_fixture import BrokerProcess

RECORDS_PER_PRODUCER = 1500
WORKER = [sys.executable, "-m", "tests.compat_pq_worker"]
DEADLINE_S = 120.0


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*WORKER, *args], cwd=Path(__file__).parent.parent)


def _acked(log: Path) -> list[int]:
    if not log.exists():
        return []
    return [int(line) for line in log.read_text().split() if line.isdigit()]


def test_two_producers_two_consumers_one_killed_every_record_acked_once(tmp_path: Path, broker: BrokerProcess) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    kill_after = rng.randrange(100, 1000)  # acks the victim makes before it holds one item and is killed
    path = str(tmp_path / "pq")
    victim_log, survivor_log = tmp_path / "victim.log", tmp_path / "survivor.log"
    producers = [
        _spawn("produce", path, broker.address, str(k * RECORDS_PER_PRODUCER), str(RECORDS_PER_PRODUCER))
        for k in range(2)
    ]
    victim = _spawn("consume", path, broker.address, str(victim_log), "30", str(kill_after))
    deadline = time.monotonic() + DEADLINE_S
    # The survivor joins half-way to the victim's kill: started together, a fast survivor could take so many records
    # that the victim never gets to kill_after (both then race for the rest, the kill among them).
    while len(_acked(victim_log)) < kill_after // 2:
        assert time.monotonic() < deadline, "the victim acked too few records"
        time.sleep(0.05)
    survivor = _spawn("consume", path, broker.address, str(survivor_log), "4", "-")
    while "holding" not in (victim_log.read_text() if victim_log.exists() else ""):
        assert time.monotonic() < deadline, "the victim never got to its held item"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for p in producers:
        assert p.wait(timeout=DEADLINE_S) == 0
    assert survivor.wait(timeout=DEADLINE_S) == 0
    acked = _acked(victim_log) + _acked(survivor_log)
    total = 2 * RECORDS_PER_PRODUCER
    assert len(acked) == len(set(acked)), f"acked twice: {sorted(n for n in set(acked) if acked.count(n) > 1)[:10]}"
    assert sorted(acked) == list(range(total)), f"lost: {sorted(set(range(total)) - set(acked))[:10]}"
    q = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process")
    assert (q.qsize(), q.unack_count(), q.acked_count()) == (0, 0, total)
    q.close()


def test_embedded_queue_refuses_a_second_process(tmp_path: Path) -> None:
    path = str(tmp_path / "pq")
    q = persistqueue.SQLiteQueue(path)
    q.put(1)
    other = subprocess.run(
        [sys.executable, "-c", "import sys, persisting.compat.persistqueue as pq; pq.SQLiteQueue(sys.argv[1])", path],
        capture_output=True,
        env={**os.environ, "PERSISTING_BROKER": ""},
    )
    assert other.returncode != 0
    assert b"TopicLockedError" in other.stderr and b"PERSISTING_BROKER" in other.stderr
    assert q.get() == 1  # the queue is untouched
    q.close()
