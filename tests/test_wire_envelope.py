"""The envelope codec (msgspec) against a real broker: values msgpack-python's strict decoding refused and msgspec
lets through (map keys that are not str, extension types, timestamps) get an error reply naming them, never a
traceback in the broker's log; and the bytes are the msgpack an older peer reads."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest
import zmq

from persisting import errors
from persisting.errors import ProtocolError
from persisting.testing.wire_fuzz import ARG_NAMES
from persisting.wire import protocol
from persisting.wire.protocol import OPS, PROTOCOL_VERSION

from .broker_fixture import BrokerProcess, make_broker

ODD_VALUES: list[Any] = [{1: "int key"}, {(1, 2): "array key"}, msgpack.ExtType(5, b"ab"), msgpack.Timestamp(0)]
CONFIG = {"durability": "process"}


def test_odd_values_in_args_get_error_replies_and_no_traceback(logged_broker: BrokerProcess) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(logged_broker.address)
    ids = itertools.count(1)
    replies: list[dict[str, Any]] = []
    try:
        for op, odd in itertools.product(sorted(OPS), ODD_VALUES):
            if op == "status":
                continue  # takes no args; the argument-by-argument pass below still sends it odd ones
            every = {name: odd for name in ARG_NAMES if name not in ("topic", "config")}
            cases = [{"topic": "t", "config": CONFIG, **every}, {"topic": odd, "config": odd}]
            cases += [{"topic": "t", "config": CONFIG, name: odd} for name in ("kinds", "sampler", "items", "of")]
            for args in cases:
                request_id = next(ids)
                s.send_multipart([msgpack.packb({"v": PROTOCOL_VERSION, "id": request_id, "op": op, "args": args})])
                assert s.poll(10_000), f"no reply to {op} {args}"
                reply = msgpack.unpackb(s.recv_multipart()[0], raw=False)
                assert reply["id"] == request_id
                replies.append(reply)
    finally:
        s.close()
        ctx.term()
    failed = [r for r in replies if not r["ok"]]
    assert failed, "no request failed: the odd values were not odd"
    assert {r["error"]["type"] for r in failed} <= set(errors.__all__), "an error that is not a typed one"
    assert logged_broker.stop() == 0
    log = logged_broker.stderr
    assert "Traceback" not in log, log[:5000]


def test_envelope_bytes_are_plain_msgpack_both_ways() -> None:
    req = protocol.Request(7, "put_batch", {"topic": "t", "count": 2, "kinds": {"a": "int"}}, [b"rows"])
    frames = protocol.encode_request(req)
    want = {"v": PROTOCOL_VERSION, "id": 7, "op": "put_batch", "args": req.args}
    assert msgpack.unpackb(frames[0], raw=False) == want
    assert frames[1:] == [b"rows"]
    old = msgpack.packb({"v": PROTOCOL_VERSION, "id": 9, "ok": True, "result": [1, b"x", None, 2.5]}, use_bin_type=True)
    reply = protocol.decode_reply([old])
    assert (reply.id, reply.ok, reply.result) == (9, True, [1, b"x", None, 2.5])


@pytest.mark.parametrize("entries", [0, 3, 14, 15, 16, 70_000])
def test_a_fixed_map_with_one_entry_added_is_the_map_of_all(entries: int) -> None:
    # A hello's answer: encoded once but for its arena figures (protocol.FixedMap), across msgpack's map headers.
    fixed = {f"k{i}": i for i in range(entries)}
    frame = protocol.encode_ok(5, protocol.FixedMap(fixed).with_entry("arena_stats", {"free_bytes": 1}))
    want = {**fixed, "arena_stats": {"free_bytes": 1}}
    assert msgpack.unpackb(frame, raw=False) == {"v": PROTOCOL_VERSION, "id": 5, "ok": True, "result": want}
    assert protocol.decode_reply([frame]).result == want


@pytest.mark.parametrize(
    "frame",
    [b"", b"\xc1", msgpack.packb({"v": PROTOCOL_VERSION, "id": 1}) + b"x", msgpack.packb([1, 2]), b"\x91" * 100_000],
)
def test_bad_envelopes_raise_protocol_error(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        protocol.decode_request([frame])


def test_plain_names_what_strict_msgpack_refused() -> None:
    assert protocol.plain({"a": [1, {"b": b"x"}], "c": None}) is None
    assert "map key" in str(protocol.plain({"a": [{3: 1}]}))
    decoded = msgspec.msgpack.decode(msgpack.packb({"a": msgpack.ExtType(1, b""), "b": msgpack.Timestamp(0)}))
    assert "extension type" in str(protocol.plain({"a": decoded["a"]}))
    assert "extension type" in str(protocol.plain([decoded["b"]]))


async def _event_loop_of(address: str) -> str:
    from persisting.client.connection import Connection

    conn = Connection(address)
    try:
        return str((await conn.request("hello", {})).result["event_loop"])
    finally:
        conn.close()


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_broker_serves_on_the_loop_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    pytest.importorskip("uvloop")  # a dependency of persisting where it builds (not on Windows)
    monkeypatch.setenv("PERSISTING_BROKER_LOOP", choice)  # the broker subprocess inherits it
    b = make_broker(tmp_path)
    try:
        b.start()
        assert asyncio.run(_event_loop_of(b.address)) == choice
        assert b.stop() == 0
    finally:
        b.ensure_dead()
