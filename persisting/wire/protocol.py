"""The wire protocol between clients and the broker: one module, one version, one encode/decode pair.

Transport: ZeroMQ, a DEALER per client process, the broker's ROUTER. A message is a list of frames::

    request   [envelope, *buffers]      envelope = msgpack {"v": PROTOCOL_VERSION, "id": int, "op": str, "args": map}
    reply     [envelope, *buffers]      envelope = msgpack {"v": PROTOCOL_VERSION, "id": int, "ok": bool,
                                                            "result": any, "error": {"type": str, "message": str}}

Raw payloads (encoded rows) travel as extra frames, never inside the envelope. Nothing is unpickled: envelopes
are msgpack of plain types, rows are msgpack of storage values (see codec.py). ``decode_*`` raise
``ProtocolError`` for anything malformed; the broker answers those with an error reply and keeps serving.
Envelopes are encoded and decoded with msgspec (the same msgpack bytes, about 3x faster than msgpack-python for
an envelope); ``plain`` tells values msgspec lets through that msgpack-python's strict decoding refused (map keys
that are not str or bytes, extension types), for the broker to name them when a request fails on one.

Operations: every request's arguments are a typed struct (requests.py, ``REQUESTS``), decoded by the broker
straight from the envelope's ``args`` (``Request.args`` is then the raw msgpack of that map); replies are typed in
replies.py. Each operation with its arguments and reply: docs/reference/protocol.md, generated from the broker's
request table (broker/requests/table.py). Every topic operation carries ``topic`` and the topic's ``config`` so
that a broker that restarted reopens the topic on the first request it gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import DedupConflictError, PayloadClearedError, ProtocolError, ProtocolVersionError, SchemaConflictError
from .requests import REQUESTS

PROTOCOL_VERSION = 3  # 2: the tensor plane operations; 3: patches ("of"), take by fields, clear, tags
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
LOGGED_VALUE_CHARS = 120  # a value from the wire is shown (in an error reply, and so in the log) cut to this
WAIT_SLICE_SECONDS = 30.0  # the longest a long-poll (wait, read with wait, take with wait) is held in one request
OPS = frozenset(REQUESTS)  # every operation a client may send
EMPTY_ARGS = b"\x80"  # msgpack's empty map: the args of a request that sends none


@dataclass(slots=True)
class Request:
    """A request: a client builds it with an ``args`` map; ``decode_request`` gives the broker the map's msgpack
    bytes (``msgspec.Raw``), which it decodes once into the operation's struct (requests.py)."""

    id: int
    op: str
    args: dict[str, Any] | msgspec.Raw
    buffers: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class Reply:
    id: int
    ok: bool
    result: Any = None
    error_type: str = ""
    error_message: str = ""
    buffers: list[bytes] = field(default_factory=list)
    # what the client needs to raise the same error again (SchemaConflictError: field, stored, given)
    error_details: dict[str, str] = field(default_factory=dict)


def shown(value: Any) -> str:
    """``repr(value)`` cut to LOGGED_VALUE_CHARS: a peer's bad value is named, never echoed whole."""
    if isinstance(value, str | bytes) and len(value) > LOGGED_VALUE_CHARS:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:LOGGED_VALUE_CHARS]!r}... ({len(value)} {unit})"
    text = repr(value)
    if len(text) <= LOGGED_VALUE_CHARS:
        return text
    size = f", {len(value)} items" if isinstance(value, list | dict) else ""
    return f"{text[:LOGGED_VALUE_CHARS]}... ({type(value).__name__}{size})"


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class _RequestEnvelope(msgspec.Struct):
    """A well-formed request envelope, decoded in one typed pass (no dict, no checks key by key)."""

    v: int
    id: int
    op: str
    args: msgspec.Raw = msgspec.Raw(EMPTY_ARGS)  # decoded by the operation's struct, not here


class _ReplyEnvelope(msgspec.Struct):
    v: int
    id: int
    ok: bool
    result: Any = None
    error: Any = None


# The typed fast path: an envelope it refuses (or another version's) goes through _envelope, which names what is
# wrong; a well-formed one of this version costs about half of the dict and its checks.
_decode_request = msgspec.msgpack.Decoder(_RequestEnvelope).decode
_decode_reply = msgspec.msgpack.Decoder(_ReplyEnvelope).decode


def _envelope(frame: bytes) -> dict[str, Any]:
    try:
        env = _decode(frame)
    except Exception as exc:  # DecodeError for garbage; RecursionError for absurd nesting
        raise ProtocolError(f"envelope is not valid msgpack: {shown(str(exc))}") from exc
    if not isinstance(env, dict):
        raise ProtocolError(f"envelope must be a map, got {type(env).__name__}")
    version = env.get("v")
    if type(version) is not int:
        raise ProtocolError(f"envelope has no integer protocol version (v), got {shown(version)}")
    if version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"protocol version {version} is not supported (this side speaks {PROTOCOL_VERSION}); "
            "upgrade the client and broker to the same persisting release"
        )
    if not isinstance(env.get("id"), int):
        raise ProtocolError("envelope has no integer request id")
    return env


def encode_request(req: Request) -> list[bytes]:
    return [_encode({"v": PROTOCOL_VERSION, "id": req.id, "op": req.op, "args": req.args}), *req.buffers]


def decode_request(frames: list[bytes]) -> Request:
    if not frames:
        raise ProtocolError("empty message")
    try:
        fast = _decode_request(frames[0])
    except Exception:  # not a well-formed envelope: the checks below say what is wrong
        pass
    else:
        if fast.v == PROTOCOL_VERSION and fast.op in OPS:
            return Request(fast.id, fast.op, fast.args, frames[1:])
    env = _envelope(frames[0])
    op, args = env.get("op"), env.get("args", {})
    if type(op) is not str or op not in OPS:  # a list or a map is not hashable: test the type first
        raise ProtocolError(f"unknown operation {shown(op)}; known: {sorted(OPS)}")
    if not isinstance(args, dict):
        raise ProtocolError("args must be a map")
    return Request(env["id"], op, msgspec.Raw(_encode(args)), list(frames[1:]))


def encode_reply(reply: Reply) -> list[bytes]:
    env: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": reply.id, "ok": reply.ok}
    if reply.ok:
        env["result"] = reply.result
    else:
        env["error"] = {"type": reply.error_type, "message": reply.error_message}
        if reply.error_details:
            env["error"]["details"] = reply.error_details
    return [_encode(env), *reply.buffers]


def loads(data: bytes) -> Any:
    """A msgpack value (msgspec's decode: maps with any keys, extension types as ``msgspec.msgpack.Ext``)."""
    return _decode(data)


def encoded(value: Any) -> msgspec.Raw:
    """``value`` encoded now, to go into envelopes as it is (a topic's config, sent with every request)."""
    return msgspec.Raw(_encode(value))


def encode_ok(request_id: int, result: Any) -> bytes:
    """The envelope of a reply with ``result`` and no buffers (``encode_reply`` of such a Reply, without it)."""
    return _encode({"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


class FixedMap:
    """A map encoded once but for one entry added per use (a hello's answer: everything but the arena's figures
    is fixed for the broker's life), so each use encodes that entry alone."""

    __slots__ = ("_header", "_items")

    def __init__(self, fixed: dict[str, Any]) -> None:
        n = len(fixed)
        self._items = _encode(fixed)[len(_map_header(n)) :]
        self._header = _map_header(n + 1)

    def with_entry(self, key: str, value: Any) -> msgspec.Raw:
        return msgspec.Raw(b"".join((self._header, self._items, _encode(key), _encode(value))))


def _map_header(n: int) -> bytes:
    """msgpack's header of a map of ``n`` entries (fixmap, map 16, map 32)."""
    if n < 16:
        return bytes((0x80 | n,))
    return b"\xde" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdf" + n.to_bytes(4, "big")


def decode_reply(frames: list[bytes]) -> Reply:
    if not frames:
        raise ProtocolError("empty reply")
    try:
        fast = _decode_reply(frames[0])
    except Exception:  # not a well-formed envelope: the checks below say what is wrong
        pass
    else:
        if fast.v == PROTOCOL_VERSION and fast.ok:
            return Reply(fast.id, True, fast.result, buffers=frames[1:])
    env = _envelope(frames[0])
    if env.get("ok") is True:
        return Reply(env["id"], True, env.get("result"), buffers=list(frames[1:]))
    error = env.get("error")
    if not isinstance(error, dict):
        raise ProtocolError("error reply without an error map")
    details = error.get("details")
    if not isinstance(details, dict) or not all(isinstance(v, str) for v in details.values()):
        details = {}
    return Reply(
        env["id"], False, None, str(error.get("type", "")), str(error.get("message", "")), error_details=details
    )


def plain(value: Any, depth: int = 0) -> str | None:
    """What in ``value`` (decoded args) is not a plain msgpack value with str or bytes map keys, or None.
    Walked only after a request failed (the request path pays nothing for it)."""
    if depth > 64:
        return "nesting deeper than 64 levels"
    if isinstance(value, msgspec.Raw):
        try:
            value = _decode(value)
        except Exception as exc:
            return f"a value msgpack cannot read ({shown(str(exc))})"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | bytes):
                return f"a map key {shown(key)} (map keys must be str)"
            if (found := plain(item, depth + 1)) is not None:
                return found
    elif type(value) is list or type(value) is tuple:  # (a namedtuple such as an ExtType is not plain)
        for item in value:
            if (found := plain(item, depth + 1)) is not None:
                return found
    elif value is not None and not isinstance(value, bool | int | float | str | bytes):
        return f"a value of type {type(value).__name__} (an extension type)"
    return None


def error_reply(request_id: int, exc: BaseException) -> Reply:
    details = {}
    if isinstance(exc, SchemaConflictError):
        details = {"field": exc.field, "stored": exc.stored, "given": exc.given}
    elif isinstance(exc, PayloadClearedError):
        details = {"rows": ",".join(map(str, exc.rows))}
    elif isinstance(exc, DedupConflictError):
        details = {"field": exc.field, "deduped": "1" if exc.deduped else ""}
    return Reply(request_id, False, error_type=type(exc).__name__, error_message=str(exc), error_details=details)
