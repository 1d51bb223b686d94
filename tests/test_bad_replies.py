"""A flood of malformed replies from whatever sits at the broker's address: each client path drops them, still
takes its real reply, and logs a line per interval, not per reply (persisting/client/bad_replies.py)."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from persisting.client import _loop
from persisting.client.connection import Connection, connection
from persisting.wire import protocol

FLOOD = 2_000


@pytest.fixture
def garbage_broker(tmp_path: Path, seed: int) -> Iterator[str]:
    """A real ROUTER on an ipc socket that answers each request with FLOOD malformed replies (random bytes, a
    reply of another protocol version, an envelope with no id), then the true reply to it."""
    address = f"ipc://{tmp_path / 'b.sock'}"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    stop = threading.Event()
    rng = random.Random(seed)

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not stop.is_set():
            if not poller.poll(50):
                continue
            identity, *body = sock.recv_multipart()
            req = protocol.decode_request(body)
            for i in range(FLOOD):
                kind = i % 3
                if kind == 0:
                    bad = [rng.randbytes(rng.randrange(1, 40))]
                elif kind == 1:
                    bad = [protocol._encode({"v": protocol.PROTOCOL_VERSION + 1, "id": req.id, "ok": True})]
                else:
                    bad = [protocol._encode({"v": protocol.PROTOCOL_VERSION, "ok": True})]
                sock.send_multipart([identity, *bad])
            sock.send_multipart([identity, *protocol.encode_reply(protocol.Reply(req.id, True, "the answer"))])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield address
    finally:
        stop.set()
        thread.join(5)
        sock.close(linger=0)
        ctx.term()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "malformed reply" in r.getMessage()]


def test_the_loop_connection_drops_a_flood_and_logs_it_once(
    garbage_broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)

    async def main() -> protocol.Reply:
        conn = Connection(garbage_broker)
        try:
            return await conn.request("hello", {}, timeout=30)
        finally:
            conn.close()

    assert asyncio.run(main()).result == "the answer"
    lines = _warnings(caplog)
    assert len(lines) == 1, lines[:5]  # one line for 2,000 bad replies inside one interval
    assert garbage_broker in lines[0]


def test_a_blocking_caller_drops_a_flood_and_logs_it_once(
    garbage_broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SyncQueue's path (``_loop.run`` of a request: the caller thread's own socket, blocking.py)."""
    caplog.set_level(logging.WARNING)

    async def hello() -> protocol.Reply:
        return await connection(garbage_broker).request("hello", {}, timeout=30)

    assert _loop.run(hello()).result == "the answer"
    assert _loop.run(hello()).result == "the answer"
    records = [r for r in caplog.records if "malformed reply" in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in records[:5]]  # 4,000 bad replies, two calls, one interval
    assert "more dropped" not in records[0].getMessage()
    # decoded in this thread: the blocking socket's path, not the engine loop's
    assert records[0].thread == threading.get_ident()


def test_the_next_interval_says_how_many_were_dropped(caplog: pytest.LogCaptureFixture) -> None:
    from persisting.client.bad_replies import BadReplies

    caplog.set_level(logging.WARNING)
    bad = BadReplies("ipc://nowhere", interval_s=0.0)  # every bad reply starts a new interval
    assert bad.decode([b"\xc1"]) is None
    assert bad.decode([b"not msgpack at all" * 50]) is None
    assert bad.total == 2
    lines = _warnings(caplog)
    assert len(lines) == 2
    quiet = BadReplies("ipc://nowhere", interval_s=3600.0)
    for _ in range(5):  # the first is logged, 4 are not
        quiet.decode([b"\xc1"])
    quiet._logged_at = -1e9  # the interval is over: the next bad one logs how many went unlogged
    quiet.decode([b"\xc1"])
    assert "(4 more dropped since the last such line)" in _warnings(caplog)[-1]
