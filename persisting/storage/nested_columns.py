"""Nested record values (kind ``nested``) as native Arrow list columns, where that round-trips exactly.

A ``nested`` field whose values are lists (nested to one depth) of one scalar type is stored as a list column any
Arrow reader understands; anything else keeps the codec's msgpack bytes (``large_binary``)::

    values                                         Arrow type (layout "list", see tensor_columns)
    [1, 2, 3]                                      large_list<int64>
    [[0.5], [], [1.5, 2.0]]                        large_list<large_list<double>>
    ["a", "b"] / [True, False]                     large_list<large_string> / large_list<bool>
    tuples, dicts, mixed types (1 and 1.0),        large_binary, persisting.layout = "bytes" (exact: a tuple
    ints beyond int64, numpy values, only []       stays a tuple, 1 stays an int)

    field metadata: persisting.layout, persisting.kind = "nested", persisting.dtype = the leaf type
    (bool, int64, double, string)

As with tensors (``tensor_columns``), a column's layout is fixed by its first write and moves to ``bytes`` (a
rewrite of that column) the first time a value does not fit; reads give the codec's row values back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import pyarrow as pa

from ..wire import codec

_LEAVES: dict[type, tuple[str, pa.DataType]] = {
    bool: ("bool", pa.bool_()),
    int: ("int64", pa.int64()),
    float: ("double", pa.float64()),
    str: ("string", pa.large_string()),
}
_BY_NAME = {name: t for name, t in _LEAVES.values()}

Sig = tuple[str | None, int, bool]
"""(leaf type, depth, exact): ``exact`` False for lists with no leaf at all (``[]``, ``[[]]``: depth at least)."""


class OpaqueTensor:
    """A torch tensor inside a nested value, left undecoded (``unpack_shallow``: the broker needs no torch)."""


def _ext_hook_shallow(code: int, data: bytes) -> Any:
    if code == codec._EXT_TORCH:
        return OpaqueTensor()
    if code == codec._EXT_TUPLE:
        return tuple(unpack_shallow(data))
    return codec._ext_hook(code, data)


def unpack_shallow(data: bytes) -> Any:
    """A nested value decoded without building torch tensors (they come back as ``OpaqueTensor``)."""
    return msgpack.unpackb(data, ext_hook=_ext_hook_shallow, raw=False, strict_map_key=False, use_list=True)


class _NoFit(Exception):
    pass


def _sig(value: Any) -> Sig:
    leaf = _LEAVES.get(type(value))
    if leaf is not None:
        if leaf[0] == "int64" and not codec.INT64_MIN <= value <= codec.INT64_MAX:
            raise _NoFit
        return leaf[0], 0, True
    if type(value) is not list:  # tuples (kept tuples by the bytes layout), dicts, numpy values
        raise _NoFit
    if not value:
        return None, 1, False
    return _combine([_sig(v) for v in value], 1)


def _combine(sigs: Sequence[Sig], up: int) -> Sig:
    leaves = {leaf for leaf, _d, _e in sigs if leaf is not None}
    exact = {d for _l, d, e in sigs if e}
    if len(leaves) > 1 or len(exact) > 1:
        raise _NoFit
    floor = max((d for _l, d, e in sigs if not e), default=0)
    if exact:
        depth = exact.pop()
        if floor > depth:
            raise _NoFit
        return (leaves.pop() if leaves else None), depth + up, True
    return None, floor + up, False


def choose(values: Sequence[Any], stored: tuple[str, int] | None) -> tuple[str, int] | None:
    """(leaf type, depth) of a list column holding ``values`` (row values: bytes or None) and what is stored, or
    None when they need the bytes layout."""
    try:
        sigs = [_sig(unpack_shallow(v)) for v in values if v is not None]
        if stored is not None:
            sigs.append((stored[0], stored[1], True))
        if not sigs:
            return stored
        leaf, depth, exact = _combine(sigs, 0)
    except _NoFit:
        return None
    if leaf is None or not exact or depth < 1:
        return None
    return leaf, depth


def arrow_type(leaf: str, depth: int) -> pa.DataType:
    t = _BY_NAME[leaf]
    for _ in range(depth):
        t = pa.large_list(t)
    return t


def build(values: Sequence[Any], shape: tuple[str, int] | None) -> pa.Array:
    """The column of row values (bytes or None): lists as Arrow lists, or (``shape`` None) the bytes."""
    if shape is None:
        return pa.array(list(values), type=pa.large_binary())
    decoded = [None if v is None else codec.decode_rows([{"v": v}], {"v": "nested"})[0]["v"] for v in values]
    return pa.array(decoded, type=arrow_type(*shape))


def row_values(shape: tuple[str, int] | None, column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Back to the codec's row values (msgpack bytes or None), whatever the layout."""
    values = column.to_pylist()
    if shape is None:
        return values
    return [None if v is None else codec.encode_value(v, "nested", "") for v in values]
