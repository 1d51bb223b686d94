"""The broker refuses each malformed argument of ``take`` (its struct in persisting/wire/requests.py, its handler
broker/requests/take.py) with an error reply that names it, and keeps serving: a well-formed take on the same
connection afterwards gets its samples."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import zmq

from persisting import Queue
from persisting.tensors.arena import peer_id
from persisting.wire import protocol

from .broker_fixture import BrokerProcess

BAD = [
    ("partition", 3, "ProtocolError", "'partition'"),
    ("task", None, "ProtocolError", "'task'"),
    ("batch_size", True, "ProtocolError", "'batch_size'"),
    ("batch_size", 2.0, "ProtocolError", "'batch_size'"),
    ("batch_size", -1, "ConfigError", "batch_size must be >= 0"),
    ("wait", "1", "ProtocolError", "take wait"),
    ("wait", -0.5, "ProtocolError", "take wait"),
    ("wait", False, "ProtocolError", "take wait"),
    ("sampler_kw", {"rank": 1}, "ProtocolError", "sampler_kw"),
    ("sampler_kw", [1], "ProtocolError", "sampler_kw"),
    ("lease_seconds", 0, "ProtocolError", "lease_seconds"),
    ("lease_seconds", True, "ProtocolError", "lease_seconds"),
    ("ready_fields", "x", "ProtocolError", "ready_fields"),
    ("ready_fields", ["x", 1], "ProtocolError", "ready_fields"),
    ("key", 7, "ProtocolError", "take key"),
    ("sampler", {"name": "nope"}, "ConfigError", "nope"),
]


def _take(request_id: int, **changed: Any) -> list[bytes]:
    args = {
        "topic": "args",
        "config": {},
        "partition": "p",
        "task": "t",
        "batch_size": 4,
        "wait": 0.0,
        "sampler": None,
        "sampler_kw": {},
        "lease_seconds": None,
        "ready_fields": None,
        "peer": peer_id(),
        **changed,
    }
    return protocol.encode_request(protocol.Request(request_id, "take", args))


def test_each_bad_take_argument_is_named_and_the_broker_serves_on(broker: BrokerProcess) -> None:
    async def put() -> None:
        async with Queue("args", broker=broker.address) as q:
            await q.put({"x": np.arange(len(BAD))}, partition_id="p")

    asyncio.run(put())
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(broker.address)

    def ask(frames: list[bytes]) -> protocol.Reply:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no reply within 10 s"
        return protocol.decode_reply(sock.recv_multipart())

    try:
        for k, (name, value, error, said) in enumerate(BAD):
            bad = ask(_take(2 * k + 1, **{name: value}))
            assert (bad.ok, bad.error_type) == (False, error), (name, value, bad)
            assert said in bad.error_message, (name, value, bad.error_message)
            good = ask(_take(2 * k + 2, batch_size=1))  # the refused take took nothing: the next sample is k
            assert good.ok and good.result[0] == [k], (name, value, good)
    finally:
        sock.close(linger=0)
