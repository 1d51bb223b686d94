"""An ack queue's ``get`` and ``ack`` through a real broker are one round trip each: the take carries a ``note``
(the item's ``UNACK`` state record, written by the broker before it replies) and ``mark_consumed`` a ``then_put``
(the ``ACKED`` record, after the consumption). Other handles see those states as before; a holder's kill leaves
its item unacknowledged for an ``auto_resume=False`` reopen; malformed riders are refused before anything is
taken or consumed (broker/requests/riders.py)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

import persisting.compat.persistqueue as persistqueue
from persisting import Queue
from persisting.client.connection import Connection
from persisting.tensors.arena import peer_id
from persisting.wire import protocol

from .broker_fixture import BrokerProcess, running_broker
from .test_operations import _scrape_unix

DEADLINE_S = 60.0


def _status(q: Any, pqid: int) -> str:
    return next(row["status"] for row in q.queue() if row["id"] == pqid)


def test_get_and_ack_are_one_request_each_and_other_handles_see_the_states(
    tmp_path: Path, broker: BrokerProcess, ops: list[str]
) -> None:
    path = str(tmp_path / "pq")
    q = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process")
    other = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process")
    try:
        for item in ("a", "b", "c"):
            q.put(item)
        other.qsize()  # opened before the gets: it learns the states from the records alone
        ops.clear()
        first = q.get(raw=True)
        assert (first["data"], ops) == ("a", ["take"])
        assert _status(other, first["pqid"]) == persistqueue.AckStatus.unack
        ops.clear()
        assert q.ack(id=first["pqid"]) == first["pqid"]
        assert ops == ["mark_consumed"]
        second = q.get(raw=True)
        ops.clear()
        q.ack_failed(id=second["pqid"])
        assert ops == ["mark_consumed"]
        assert (other.acked_count(), other.ack_failed_count(), other.unack_count(), other.qsize()) == (1, 1, 0, 1)
        assert _status(other, first["pqid"]) == persistqueue.AckStatus.acked
        third = q.get(raw=True)
        q.nack(id=third["pqid"])  # ready again: the next get hands it out once more
        assert other.get(raw=True)["pqid"] == third["pqid"]
        with pytest.raises(persistqueue.Empty):
            q.get(block=False)
    finally:
        q.close()
        other.close()


def test_a_killed_holders_item_stays_unacked_for_a_reopen_without_auto_resume(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    path, log = str(tmp_path / "pq"), tmp_path / "holder.log"
    q = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process")
    for n in range(2):
        q.put({"n": n})
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.compat_pq_worker", "consume", path, broker.address, str(log), "30", "0"],
        cwd=Path(__file__).parent.parent,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while "holding" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the holder never got its item"
            time.sleep(0.05)
        assert _status(q, 1) == persistqueue.AckStatus.unack  # noted by the holder's take
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    q.close()
    # The dead holder's lease ends at the next take (the reopen's own, by id, for what the records say is unacked).
    again = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process", auto_resume=False)
    try:
        assert again.get(block=False) == {"n": 1}  # item 1 stays unacknowledged, not handed out
        with pytest.raises(persistqueue.Empty):
            again.get(block=False)
        again.resume_unack_tasks()
        assert again.get(block=False) == {"n": 0}
    finally:
        again.close()


BAD_NOTES = ["x", {"partition": 1, "field": "i", "values": {}}, {"partition": "s", "field": "i", "values": {"i": 1}}]
BAD_PUTS = ["x", {"partition": "s", "kinds": {}, "count": 0}, {"partition": "s", "kinds": [], "count": 0, "key": "k"}]


def _request(request_id: int, op: str, **args: Any) -> list[bytes]:
    every = {"topic": "riders", "config": {}, "partition": "p", "peer": peer_id(), **args}
    return protocol.encode_request(protocol.Request(request_id, op, every))


def _take(request_id: int, **args: Any) -> list[bytes]:
    return _request(request_id, "take", task="t", batch_size=1, wait=0.0, key=f"k{request_id}", **args)


def test_malformed_riders_are_refused_before_the_take_or_the_consumption(broker: BrokerProcess) -> None:
    async def put() -> None:
        async with Queue("riders", broker=broker.address) as q:
            await q.put({"x": np.arange(len(BAD_NOTES) + 1)}, partition_id="p")

    asyncio.run(put())
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(broker.address)

    def ask(frames: list[bytes]) -> protocol.Reply:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no reply within 10 s"
        return protocol.decode_reply(sock.recv_multipart())

    try:
        rid = 0
        for k, note in enumerate(BAD_NOTES):
            bad = ask(_take(rid := rid + 1, note=note))
            assert (bad.ok, bad.error_type) == (False, "ProtocolError") and "take note" in bad.error_message, bad
            good = ask(_take(rid := rid + 1, note={"partition": "s", "field": "i", "values": {"st": 2}}))
            assert good.ok and good.result[0] == [k] and good.result[-1][1] == 1, good  # the refused take took none
        for spec in BAD_PUTS:
            bad = ask(_request(rid := rid + 1, "mark_consumed", task="u", indexes=[0], then_put=spec))
            assert (bad.ok, bad.error_type) == (False, "ProtocolError") and "then_put" in bad.error_message, bad
        good = ask(_request(rid := rid + 1, "take", task="u", batch_size=1, wait=0.0, key="u"))
        assert good.ok and good.result[0] == [0], good  # the refused mark_consumed consumed nothing
    finally:
        sock.close(linger=0)


def test_the_records_riders_write_count_as_puts_in_the_metrics(tmp_path: Path) -> None:
    sock = str(tmp_path / "metrics.sock")
    with running_broker(tmp_path, ["--metrics", f"unix:{sock}"]) as broker:
        q = persistqueue.SQLiteAckQueue(str(tmp_path / "pq"), broker=broker.address, durability="process")
        try:
            q.put("a")
            q.ack(q.get())  # the take's note writes the UNACK record, mark_consumed's then_put the ACKED one
        finally:
            q.close()
        scraped = _scrape_unix(sock)
    put = {k.split("partition=")[1].split(",")[0]: v for k, v in scraped.items() if "put_samples_total" in k}
    assert (put['"items"'], put['"state"']) == (1, 2), put


def test_a_broker_that_writes_no_riders_gets_the_state_records_as_separate_requests(
    tmp_path: Path, broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, ops: list[str]
) -> None:
    """A broker of this protocol version from before the riders ignores a note and a then_put; its hello lists
    no "riders" feature (what this test's hello shows), and the layer writes each state record itself."""
    real = Connection.request

    async def request(self: Connection, op: str, *args: Any, **kwargs: Any) -> Any:
        reply = await real(self, op, *args, **kwargs)
        if op == "hello":
            reply.result.pop("features", None)
        return reply

    monkeypatch.setattr(Connection, "request", request)  # inside the ops spy: ops still sees every request
    path = str(tmp_path / "pq")
    q = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process")
    other = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process")
    try:
        for item in ("a", "b", "c"):
            q.put(item)
        other.qsize()
        ops.clear()
        first = q.get(raw=True)
        assert "take" in ops and "put_batch" in ops  # the UNACK record in a request of its own
        assert _status(other, first["pqid"]) == persistqueue.AckStatus.unack
        ops.clear()
        assert q.ack(id=first["pqid"]) == first["pqid"]
        assert ops == ["mark_consumed", "put_batch"]  # the ACKED record after the consumption
        second = q.get(raw=True)
        q.ack_failed(id=second["pqid"])
        assert (other.acked_count(), other.ack_failed_count(), other.unack_count(), other.qsize()) == (1, 1, 0, 1)
        assert _status(other, first["pqid"]) == persistqueue.AckStatus.acked
    finally:
        q.close()
        other.close()
    again = persistqueue.SQLiteAckQueue(path, broker=broker.address, durability="process")
    try:
        assert (again.acked_count(), again.ack_failed_count(), again.qsize()) == (1, 1, 1)
        assert again.get() == "c"
    finally:
        again.close()
