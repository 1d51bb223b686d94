"""Every route of the request table against a real broker: a request missing its arguments, or with one of the
wrong type, gets a ``ProtocolError`` reply naming the argument, is counted as a bad request (complaints.py, the
status map's ``bad_frames``), and the broker serves on."""

from __future__ import annotations

import itertools
from typing import Any

import msgpack
import msgspec
import zmq

from broker.requests.table import ROUTES
from persisting.wire.protocol import PROTOCOL_VERSION

from .broker_fixture import BrokerProcess

TOPIC = {"topic": "table", "config": {"durability": "process"}}
WRONG: dict[Any, Any] = {str: 7, int: "seven", float: "seven", bool: "yes", bytes: 7}


def _wrong_value(route_args: type[msgspec.Struct]) -> tuple[str, Any] | None:
    """A required argument of a plain type and a value of another type, if the struct has one."""
    for f in msgspec.structs.fields(route_args):
        if f.required and f.name not in ("topic", "config") and f.type in WRONG:
            return f.encode_name, WRONG[f.type]
    return None


def test_each_route_names_a_bad_argument_and_counts_it(logged_broker: BrokerProcess) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(logged_broker.address)
    ids = itertools.count(1)

    def ask(op: str, args: Any) -> dict[str, Any]:
        s.send_multipart([msgpack.packb({"v": PROTOCOL_VERSION, "id": next(ids), "op": op, "args": args})])
        assert s.poll(10_000), f"no reply to {op} {args}"
        reply = msgpack.unpackb(s.recv_multipart()[0], raw=False)
        assert isinstance(reply, dict)
        return reply

    refused = 0
    try:
        for route in ROUTES:
            base = dict(TOPIC) if route.topic else {}
            wrong = _wrong_value(route.args)
            if wrong is not None:
                name, value = wrong
                reply = ask(route.op, {**base, name: value})
                assert not reply["ok"] and reply["error"]["type"] == "ProtocolError", (route.op, reply)
                assert f"{name!r}" in reply["error"]["message"] and route.op in reply["error"]["message"]
                refused += 1
            if route.topic:  # a topic request without its topic
                reply = ask(route.op, {})
                assert not reply["ok"] and "'topic'" in reply["error"]["message"], (route.op, reply)
                refused += 1
            reply = ask(route.op, [1, 2])  # args that are not a map
            assert not reply["ok"] and reply["error"]["type"] == "ProtocolError", (route.op, reply)
            refused += 1
        status = ask("status", {})
        assert status["ok"], status
        assert status["result"]["bad_frames"]["bad_request"] == refused
        assert ask("count", TOPIC)["result"] == 0  # and it serves on
    finally:
        s.close()
        ctx.term()
    assert refused > 2 * len(ROUTES)
    assert logged_broker.stop() == 0
    assert "Traceback" not in logged_broker.stderr
