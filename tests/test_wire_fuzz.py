"""Seeded random frames against a real broker: every frame gets a reply, the broker keeps serving, its log has no
traceback and stays small (persisting/testing/wire_fuzz.py makes the frames; ``python -m bench chaos`` sends more)."""

from __future__ import annotations

import os

import msgpack
import pytest
import zmq

from persisting import SyncQueue
from persisting.testing import wire_fuzz
from persisting.wire.protocol import PROTOCOL_VERSION

from .broker_fixture import BrokerProcess

FRAMES = int(os.environ.get("PERSISTING_FUZZ_FRAMES", "600"))
LOG_BYTES_PER_FRAME_MAX = 200  # complaints are one line per peer and interval, values cut short


def _ask(address: str, env: dict[object, object]) -> dict[str, object]:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    try:
        s.send_multipart([msgpack.packb(env)])
        assert s.poll(10_000), f"no reply to {str(env)[:200]}"
        reply = msgpack.unpackb(s.recv_multipart()[0], raw=False)
        assert isinstance(reply, dict)
        return reply
    finally:
        s.close()
        ctx.term()


@pytest.mark.parametrize("op", [["hello"], {"a": 1}, 7, None, b"hello", 1.5, "o" * 65536])
def test_an_op_of_any_type_gets_a_protocol_error_reply(logged_broker: BrokerProcess, op: object) -> None:
    reply = _ask(logged_broker.address, {"v": PROTOCOL_VERSION, "id": 5, "op": op, "args": {}})
    assert reply["ok"] is False and reply["id"] == 5
    error = reply["error"]
    assert isinstance(error, dict) and error["type"] == "ProtocolError"
    assert len(error["message"]) < 1000  # a 64 KiB op name is not echoed whole
    assert logged_broker.stop() == 0
    log = logged_broker.stderr
    assert "Traceback" not in log
    assert len(log) < 4000, log[-4000:]


def test_seeded_random_frames(logged_broker: BrokerProcess, seed: int) -> None:
    result = wire_fuzz.send(logged_broker.address, seed, FRAMES)
    assert result.missing == [], f"seed {seed}: frames {result.missing[:10]} got no reply"
    assert result.replies == FRAMES
    assert logged_broker.proc is not None and logged_broker.proc.poll() is None
    with SyncQueue("after-fuzz", broker=logged_broker.address) as q:
        q.put({"a": 1})
        assert q.get() == [{"a": 1}]
    assert logged_broker.stop() == 0
    log = logged_broker.stderr
    assert "Traceback" not in log, f"seed {seed}:\n{log[:5000]}"
    assert len(log.encode()) / FRAMES < LOG_BYTES_PER_FRAME_MAX, f"seed {seed}: {len(log)} log bytes"
