"""docs/reference/protocol.md, made from the request table: each operation, its arguments, its reply.

``python -m broker.requests.doc`` writes the page; tests/test_protocol_doc.py fails when the page and the table
differ, so a request changed without its page (or the page edited by hand) is caught.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from persisting.wire import protocol

from .table import ROUTES

PAGE = Path("docs/reference/protocol.md")
_NAMES = {str: "str", int: "int", float: "float", bool: "bool", bytes: "bytes", dict: "map", list: "array"}

_HEAD = """# Wire protocol

<!-- Generated from broker/requests/table.py by `python -m broker.requests.doc`; tests/test_protocol_doc.py
checks it. Edit the table (and the structs of persisting/wire/requests.py, replies.py), not this page. -->

Clients and the broker speak msgpack over ZeroMQ (a DEALER per client process, the broker's ROUTER), protocol
version {version}, checked at connect. A message is a list of frames:

    request   [envelope, *buffers]   envelope = {{"v": {version}, "id": int, "op": str, "args": map}}
    reply     [envelope, *buffers]   envelope = {{"v": {version}, "id": int, "ok": bool, "result": any,
                                                 "error": {{"type": str, "message": str}}}}

Raw payloads (rows, dense columns) travel as extra frames, never inside the envelope; nothing is unpickled. Each
request's `args` are decoded into the operation's struct once: a missing argument or one of the wrong type (a
bool is never a number) gets a `ProtocolError` reply naming it. Arguments not listed are ignored. Every topic
request carries `topic` (str) and `config` (the topic's settings, a map), so a restarted broker reopens the topic
on the first request it gets; below they are left out. `[a, b]` is a positional array, `{{a, b}}` a map; "nil" is
msgpack's nil.

"""


def _type(t: Any) -> str:
    """A type as the page words it."""
    if t is Any:
        return "any"
    if t is None or t is type(None):
        return "nil"
    if t in _NAMES:
        return _NAMES[t]
    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(t)
        bounds = [f">= {m.ge}" for m in meta if getattr(m, "ge", None) is not None]
        bounds += [f"> {m.gt}" for m in meta if getattr(m, "gt", None) is not None]
        return " ".join([_type(base), *bounds])
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type(a) for a in typing.get_args(t))
    if origin is list:
        (item,) = typing.get_args(t)
        return f"array of {_type(item)}"
    if origin is dict:
        return "map"
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return f"`{t.__name__}`"
    return getattr(t, "__name__", str(t))


def _shape(struct: type[msgspec.Struct]) -> str:
    """A struct's fields as its encoding lays them out: ``[a, b]`` (array_like) or ``{a, b}``."""
    names = [f.encode_name for f in msgspec.structs.fields(struct)]
    if struct.__struct_config__.array_like:
        return "[" + ", ".join(names) + "]"
    return "{" + ", ".join(names) + "}"


def _fields(struct: type[msgspec.Struct], skip: frozenset[str] = frozenset()) -> list[str]:
    rows = []
    for f in msgspec.structs.fields(struct):
        if f.name in skip:
            continue
        if f.required:
            default = "required"
        else:
            value = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
            default = "nil" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
        rows.append(f"| `{f.encode_name}` | {_type(f.type)} | {default} |")
    return rows


def _nested(t: Any, seen: dict[str, type[msgspec.Struct]]) -> None:
    """The structs ``t`` names, inner ones too, by name."""
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        if t.__name__ not in seen:
            seen[t.__name__] = t
            for f in msgspec.structs.fields(t):
                _nested(f.type, seen)
        return
    for arg in typing.get_args(t):
        _nested(arg, seen)


def render() -> str:
    out = [_HEAD.format(version=protocol.PROTOCOL_VERSION), "## Requests", ""]
    structs: dict[str, type[msgspec.Struct]] = {}
    for route in ROUTES:
        skip = frozenset({"topic", "config"}) if route.topic else frozenset()
        fields = _fields(route.args, skip)
        out += [f"### `{route.op}`", "", route.doc[0].upper() + route.doc[1:] + ".", ""]
        where = "a topic request" if route.topic else "no topic"
        copies = "" if route.cached else "; a copy sent twice runs twice, there is no reply cache"
        out += [f"Arguments ({where}{copies}):", ""]
        out += ["| argument | type | default |", "|---|---|---|", *fields] if fields else ["none"]
        out += ["", f"Reply: {_type(route.reply)}.", ""]
        for f in msgspec.structs.fields(route.args):
            _nested(f.type, structs)
        _nested(route.reply, structs)
    out += ["## Structs", "", "What the arguments and replies above name, as they are encoded.", ""]
    for name in sorted(structs):
        struct = structs[name]
        doc = " ".join((struct.__doc__ or "").split())
        out += [f"### `{name}`", "", f"`{_shape(struct)}`" + (f": {doc}" if doc else ""), ""]
        out += ["| field | type | default |", "|---|---|---|", *_fields(struct), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    """Write the page (run from the repository root)."""
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PAGE
    target.write_text(render())
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
