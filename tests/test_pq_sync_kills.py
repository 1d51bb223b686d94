"""The persist-queue layer's records at ``durability="sync"`` (persisting/compat/persistqueue/_store.py's doc): a
get's UNACK (with auto_resume) and a Unique get's DELETED are written, not synced, and an embedded open repairs
where the state records and the engine's consumption disagree.

- SIGKILL at random moments of random puts, gets, acks and nacks (seed printed), then a drain: every acknowledged
  put is got, an acked item is never handed out again, and (Unique) every value got is free to be put again.
- The outcomes of a power loss that took the unsynced tail of one file and not the other, made by hand: an ack
  whose consumption record is gone is still never handed out again; a Unique item taken without its DELETED record
  frees its bytes at the next open, and a DELETED record without its take consumes the item.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import persisting.compat.persistqueue as persistqueue
from persisting.compat import _engine
from persisting.compat.persistqueue._state import DELETED
from persisting.errors import Empty

WORKER = [sys.executable, "-m", "tests.pq_kill_worker"]
ROUNDS = 6
ROUND_VALUES = 1_000_000  # round r puts the values r * ROUND_VALUES, r * ROUND_VALUES + 1, ...
READY_DEADLINE_S = 120.0


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _kill_rounds(cls: str, path: Path, log: Path, rng: random.Random) -> None:
    for r in range(ROUNDS):
        seen = len(_lines(log))
        args = [cls, str(path), str(log), str(rng.randrange(2**32)), str(r * ROUND_VALUES)]
        proc = subprocess.Popen([*WORKER, *args], cwd=Path(__file__).parent.parent)
        try:
            deadline = time.monotonic() + READY_DEADLINE_S
            while "ready" not in _lines(log)[seen:]:
                assert proc.poll() is None, f"worker exited with {proc.returncode}"
                assert time.monotonic() < deadline, "worker did not start"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.05, 1.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        with open(log, "a") as f:
            f.write("killed\n")


def _drain(q: object, log: Path, ack: bool) -> None:
    with open(log, "a") as f:
        while True:
            try:
                got = q.get(block=False, raw=True)  # type: ignore[attr-defined]
            except Empty:
                return
            f.write(f"got {got['data']}\n")
            if ack:
                q.ack(id=got["pqid"])  # type: ignore[attr-defined]
                f.write(f"acked {got['data']}\n")


@pytest.mark.parametrize("cls", ["SQLiteAckQueue", "UniqueQ", "UniqueAckQ"])
def test_sigkill_at_random_moments_keeps_every_put_and_never_hands_out_an_acked_item(
    tmp_path: Path, seed: int, cls: str
) -> None:
    rng = random.Random(seed)
    path, log = tmp_path / "q", tmp_path / "log"
    _kill_rounds(cls, path, log, rng)
    ack = cls != "UniqueQ"
    q = getattr(persistqueue, cls)(str(path))
    _drain(q, log, ack)
    put: set[int] = set()
    got: set[int] = set()
    acked: set[int] = set()
    maybe_acked: set[int] = set()  # got just before a kill: its ack may have run without its log line
    in_flight: set[int] = set()  # per round: the value a put killed before its log line may have stored
    r, last_put, last = 0, None, None
    for line in _lines(log):
        if line == "ready":
            continue
        if line == "killed":
            in_flight.add(r * ROUND_VALUES if last_put is None else last_put + 1)
            if last is not None and last[0] == "got":
                maybe_acked.add(last[1])
            r, last_put, last = r + 1, None, None
            continue
        what, value = line.split()
        n = int(value)
        last = (what, n)
        if what == "put":
            put.add(n)
            last_put = n
        elif what == "got":
            assert n in put or n in in_flight, f"{n} was got but never put"
            assert n not in acked, f"{n} was handed out again after its ack"
            if not ack:
                assert n not in got, f"{n} was handed out twice"
            got.add(n)
            maybe_acked.discard(n)  # handed out again: its ack had not run
        elif what == "acked":
            assert n not in acked, f"{n} was acked twice"
            acked.add(n)
    assert put and got, "the workers were killed before they put and got anything"
    if ack:
        missing = put - acked - maybe_acked
        assert not missing, f"acknowledged puts never acked: {sorted(missing)[:10]}"
    else:
        # A get killed before its log line took an item for good (consume-on-fetch): at most one per round.
        missing = put - got
        assert len(missing) <= ROUNDS, f"acknowledged puts never got: {sorted(missing)[:10]}"
    if "Unique" in cls and not ack:
        # Nothing is live after the drain: every value got may be put again (the repair freed taken items' bytes).
        again = sorted(got | missing)
        ids = [q.put(n) for n in again]
        assert None not in ids, f"{again[ids.index(None)]} was taken, yet its bytes still count as live"
        assert q.qsize() == len(again)
    q.close()


def _consumption_log(path: Path) -> Path:
    (log,) = (path / "data.db-persisting").glob("*/consumption.log")
    return log


def test_an_ack_whose_consumption_record_was_lost_is_never_handed_out_again(tmp_path: Path) -> None:
    path = tmp_path / "q"
    q = persistqueue.SQLiteAckQueue(str(path))
    for n in range(3):
        q.put(n)
    first = q.get()
    log = _consumption_log(path)
    before = os.path.getsize(log)
    q.ack(first)
    q.close()
    assert os.path.getsize(log) > before
    os.truncate(log, before)  # a power loss took the ack's unsynced consumption record; its ACKED record stays
    q = persistqueue.SQLiteAckQueue(str(path))
    assert [q.get(), q.get()] == [1, 2]
    with pytest.raises(Empty):
        q.get(block=False)
    assert q.acked_count() == 1
    q.close()


def test_a_unique_take_without_its_deleted_record_frees_its_bytes_at_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "q"
    q = persistqueue.UniqueQ(str(path))
    assert q.put("a") == 1
    assert q.put("b") == 2
    assert _take(q) == 1  # the state a kill -9 (or a power loss) leaves between a get's take and its DELETED
    assert q.put("a") is None  # still live in this process: the record never came
    q.close()
    q = persistqueue.UniqueQ(str(path))
    assert q.put("a") is not None
    assert [q.get(), q.get()] == ["b", "a"]
    q.close()


def test_a_unique_deleted_record_without_its_take_consumes_the_item_at_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "q"
    q = persistqueue.UniqueQ(str(path))
    q.put("a")
    q.put("b")
    # The state a power loss leaves when the log kept the DELETED record and the consumption log lost the take.
    _engine.run(q._impl._store.state.set([1], DELETED))
    q.close()
    q = persistqueue.UniqueQ(str(path))
    assert q.qsize() == 1
    assert q.get() == "b"
    with pytest.raises(Empty):
        q.get(block=False)
    q.close()


def _take(q: persistqueue.UniqueQ) -> int:
    """A consume-on-fetch take of the next item without the layer's DELETED record: its global index + 1."""
    store = q._impl._store
    taken = _engine.run(store._take_one("items", None, 0.0, False))
    assert taken is not None
    return taken[0] + 1
