"""Seeded random frames for a broker's socket: garbage, malformed envelopes and well-formed requests with random
arguments (``python -m bench chaos`` and tests/test_wire_fuzz.py send them to a real broker).

Every frame a client can send must get a reply (an error reply for anything malformed) and never a traceback in
the broker's log; ``FuzzRun`` sends frames one at a time over one DEALER socket and checks the first part. Waits
in the random requests (``wait``, ``timeout``) are capped at ``MAX_WAIT_S`` so that each frame is answered soon.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

import msgpack
import msgspec
import zmq

from ..wire.protocol import OPS, PROTOCOL_VERSION
from ..wire.requests import REQUESTS

MAX_WAIT_S = 0.05
REPLY_TIMEOUT_S = 10.0  # a reply slower than this counts as missing (a topic's first open takes a while)
LONG_STR_CHARS = 64 * 1024
# every argument some request takes (wire/requests.py), so a new one is fuzzed without a change here
ARG_NAMES = sorted({f.encode_name for args in REQUESTS.values() for f in msgspec.structs.fields(args)})
TOPICS = ("fz0", "fz1")
_OPS = sorted(OPS)


def value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-able value: scalars of every type (huge ints, NaN, long strings) and nested lists/maps."""
    pick = rng.randrange(12 if depth < 3 else 9)
    if pick == 0:
        return None
    if pick == 1:
        return rng.random() < 0.5
    if pick == 2:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, -(2**63), rng.randrange(-1000, 1000)])
    if pick == 3:
        return rng.choice([0.0, -0.5, 1e308, float("nan"), float("inf"), rng.uniform(-10, 10)])
    if pick == 4:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(0, 12)))
    if pick == 5:
        return rng.randbytes(rng.randrange(0, 40))
    if pick == 6:
        return rng.choice([*_OPS, *TOPICS, "", "\x00", "_persisting_index", "tensor", "int", "nested"])
    if pick == 7:
        return "x" * (LONG_STR_CHARS if rng.random() < 0.1 else rng.randrange(100, 2000))
    if pick == 8:
        return [rng.randrange(0, 50) for _ in range(rng.randrange(0, 6))]
    if pick == 9:
        return [value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if pick == 10:
        return {rng.choice([*ARG_NAMES, "a", "b"]): value(rng, depth + 1) for _ in range(rng.randrange(0, 5))}
    if rng.random() < 0.2:
        return {rng.randrange(-5, 5): value(rng, depth + 1)}  # int keys: the broker's envelope refuses them
    return {"k": value(rng, depth + 1)}


def _plausible(name: str, rng: random.Random) -> Any:
    """A value of the right type for argument ``name``, so that requests get past the type checks."""
    small = rng.randrange(0, 40)
    table: dict[str, Any] = {
        "partition": rng.choice(["p0", "p1", "default"]),
        "kinds": {"a": "int"},
        "count": rng.randrange(0, 4),
        "key": f"k{rng.randrange(50)}",
        "offset": small,
        "limit": rng.randrange(0, 50),
        "wait": MAX_WAIT_S,
        "index": small,
        "timeout": MAX_WAIT_S,
        "nbytes": rng.randrange(1, 1 << 16),
        "peer": [rng.randrange(1, 1 << 22), rng.randrange(1 << 30)],
        "extent": rng.randrange(0, 8),
        "fields": rng.choice([["a"], ["a", "obs"], []]),
        "generation": rng.randbytes(8),
        "task": rng.choice(["t0", "t1"]),
        "batch_size": rng.randrange(0, 8),
        "indexes": [rng.randrange(0, 40) for _ in range(rng.randrange(0, 5))],
        "zerocopy": rng.random() < 0.5,
        "hold": rng.randrange(0, 8),
        "sampler": None,
        "sampler_kw": {},
        "lease_seconds": rng.choice([None, MAX_WAIT_S]),
        "ready_fields": rng.choice([None, ["a"]]),
        "items": [[rng.randrange(0, 40), {"tag": rng.randrange(5)}]],
        "release": [],
        "abandon": [],
        "lease_next": 0,
        "of": None,
    }
    return table.get(name)


def _args(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return value(rng)
    args: dict[str, Any] = {}
    if rng.random() < 0.9:
        args["topic"] = rng.choice(TOPICS) if rng.random() < 0.95 else value(rng)
        args["config"] = {} if rng.random() < 0.9 else value(rng)
    for name in rng.sample(ARG_NAMES, rng.randrange(0, 8)):
        args[name] = value(rng)
    if rng.random() < 0.6:  # plausible arguments, then one or two of them random
        args.update({name: _plausible(name, rng) for name in ARG_NAMES if name not in ("topic", "config")})
        for name in rng.sample(ARG_NAMES, rng.randrange(0, 3)):
            args[name] = value(rng)
    for name in ("wait", "timeout", "lease_seconds"):
        v = args.get(name)
        if isinstance(v, int | float) and not isinstance(v, bool):
            args[name] = min(max(float(v), 0.0), MAX_WAIT_S)
    for name in ("nbytes", "batch_size", "limit", "count", "lease_next"):
        v = args.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 10**6:
            args[name] = v % 10**6  # a request for terabytes is refused, not fuzz-worthy
    return args


def frames(rng: random.Random, request_id: int) -> list[bytes]:
    """One random message (without the ROUTER identity); its envelope's id is ``request_id`` where it has one."""
    kind = rng.randrange(10)
    if kind == 0:  # garbage
        return [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:  # msgpack, not a map
        return [msgpack.packb(value(rng), use_bin_type=True)]
    env: dict[Any, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "op": rng.choice(_OPS), "args": _args(rng)}
    if env["op"] == "wait" and isinstance(env["args"], dict) and env["args"].get("timeout") is None:
        env["args"]["timeout"] = MAX_WAIT_S  # a wait without one is a legitimate 30 s long-poll
    if kind == 2:  # a bad envelope field
        env[rng.choice(["v", "id", "op", "args"])] = value(rng)
    elif kind == 3:
        del env[rng.choice(["v", "id", "op", "args"])]
    elif kind == 4:  # an op that is a list or a map, or a long str
        env["op"] = rng.choice([[value(rng)], {"op": "hello"}, "o" * LONG_STR_CHARS, value(rng)])
    body = [msgpack.packb(env, use_bin_type=True)]
    if rng.random() < 0.3:
        rows = [{"a": rng.randrange(100)} for _ in range(rng.randrange(0, 4))]
        body.append(msgpack.packb(rows))
    for _ in range(rng.choices([0, 1, 2], [6, 3, 1])[0]):
        body.append(rng.randbytes(rng.randrange(0, 64)) if rng.random() < 0.5 else msgpack.packb(value(rng)))
    return body


@dataclass
class FuzzResult:
    frames: int = 0
    replies: int = 0
    error_replies: int = 0
    missing: list[int] = field(default_factory=list)  # indexes of frames that got no reply in time
    missing_frames: list[str] = field(default_factory=list)  # what they were (cut), to replay and report


def send(address: str, seed: int, count: int) -> FuzzResult:
    """Send ``count`` random frames made from ``seed``, one at a time, each awaiting its reply."""
    rng = random.Random(seed)
    out = FuzzResult()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        for n in range(count):
            request_id = 1_000_000 + n
            message = frames(rng, request_id)
            sock.send_multipart(message)
            out.frames += 1
            if not sock.poll(int(REPLY_TIMEOUT_S * 1000)):
                out.missing.append(n)
                out.missing_frames.append(_describe(message))
                continue
            reply = sock.recv_multipart()
            env = msgpack.unpackb(reply[0], raw=False)
            out.replies += 1
            if not env.get("ok"):
                out.error_replies += 1
            while sock.poll(0):  # a late reply to an earlier frame: counted, not mistaken for this one's
                sock.recv_multipart()
    finally:
        sock.close()
        ctx.term()
    return out


def _describe(message: list[bytes]) -> str:
    try:
        head = repr(msgpack.unpackb(message[0], raw=False, strict_map_key=False))
    except Exception:
        head = repr(message[0][:200])
    return f"{head[:600]} + {len(message) - 1} more frame(s)"
