"""A blocking call in broker mode makes its round trip on its own thread's socket (client/blocking.py), with the
engine loop's baton lent back while it waits; against a real broker subprocess, stalled and killed."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from persisting import BrokerUnavailableError, SyncQueue
from persisting.client import blocking, connection

from .broker_fixture import BrokerProcess


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Threads in which BlockingSocket.request ran, one entry per call."""
    calls: list[int] = []
    real = blocking.BlockingSocket.request

    def counted(self: blocking.BlockingSocket, *args: Any) -> Any:
        calls.append(threading.get_ident())
        return real(self, *args)

    monkeypatch.setattr(blocking.BlockingSocket, "request", counted)
    return calls


def test_sync_calls_use_the_callers_own_socket(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    with SyncQueue("own", broker=broker.address, durability="process") as q:
        q.put({"i": -1})  # opened: the steady state from here
        calls = _counting(monkeypatch)
        for i in range(20):
            q.put({"i": i})
        seen: dict[str, int] = {}

        def other() -> None:
            q.put({"i": 100})
            seen["socket"] = id(blocking.socket_for(broker.address))

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert [r["i"] for r in q.get(limit=100)] == [-1, *range(20), 100]
        mine = blocking.socket_for(broker.address)
    # A call that found the loop busy (a timer of its own just then) goes through the loop; most must not.
    assert sum(1 for c in calls if c == threading.get_ident()) >= 15, calls
    assert seen["socket"] != id(mine)  # each thread its own connection


def test_a_waiting_call_lends_the_baton(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """A take held at the broker for new samples blocks only its own thread: a put from another thread runs
    meanwhile (with the baton kept, the put would wait out the whole hold and the take would come back empty)."""
    with SyncQueue("lend", broker=broker.address, durability="process") as q:
        calls = _counting(monkeypatch)
        got: list[Any] = []
        waiting = threading.Thread(
            target=lambda: got.append(q.get_meta(batch_size=1, task_name="t", wait=True, timeout=20))
        )
        waiting.start()
        while not calls:  # the take is on its way to the broker
            time.sleep(0.01)
        time.sleep(0.3)  # and held there
        q.put({"i": 1})
        waiting.join()
        assert [s.global_index for s in got[0].samples] == [0]


def test_a_restarted_broker_gets_the_waiting_call_again(broker: BrokerProcess) -> None:
    """kill -9 of the broker, a blocking put sent into the void, the broker back at the same address: the put is
    sent again on reconnect and stored exactly once."""
    assert broker.proc is not None
    with SyncQueue("restart", broker=broker.address, durability="sync") as q:
        q.put_batch([{"m": 1}])
        broker.kill()
        done: list[Any] = []
        putter = threading.Thread(target=lambda: done.append(q.put_batch([{"m": 2}, {"m": 2}])))
        putter.start()
        broker.start()
        putter.join(60)
        assert not putter.is_alive()
        assert done and len(done[0]) == 2
        assert sorted(r["m"] for r in q.get(limit=100)) == [1, 2, 2]


def test_a_stalled_broker_times_out_and_a_late_reply_is_not_taken_for_the_next(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert broker.proc is not None
    monkeypatch.setattr(connection, "REQUEST_TIMEOUT_SECONDS", 1.0)
    with SyncQueue("late", broker=broker.address, durability="process") as q:
        q.put({"n": 0})
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(BrokerUnavailableError, match="within 1 s"):
                q.put({"n": 1})
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        assert q.stats()["total_count"] == 2  # the stalled put was stored; its reply came late and was dropped
        assert len(q) == 2


def test_a_threads_socket_closes_when_the_thread_ends(broker: BrokerProcess, tmp_path: Path) -> None:
    kept: list[blocking.BlockingSocket] = []

    def work() -> None:
        with SyncQueue("ends", broker=broker.address) as q:
            q.put({"x": 1})
        kept.append(blocking.socket_for(broker.address))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    gc.collect()
    assert kept and kept[0]._sock.closed and kept[0]._monitor.closed


def test_a_forked_child_makes_its_own_socket_and_leaves_the_parents_alone(broker: BrokerProcess) -> None:
    with SyncQueue("fork", broker=broker.address, durability="process") as q:
        q.put({"who": "parent"})
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a blocking call of its own (no Lance), then leave at once
            code = 1
            try:
                gc.collect()  # the parent's thread-local sockets are dropped here, not closed
                with SyncQueue("fork", broker=broker.address, durability="process") as mine:
                    mine.put({"who": "child"})
                    os.write(write_end, str(len(mine)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        try:
            seen = os.read(read_end, 64).decode()
        finally:
            os.close(read_end)
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and seen == "2"
        q.put({"who": "parent"})  # the parent's own socket still works
        assert [r["who"] for r in q.get(limit=10)] == ["parent", "child", "parent"]
