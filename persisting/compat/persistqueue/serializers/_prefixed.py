"""A binary serializer made file-friendly with a 4-byte little-endian length prefix (msgpack, cbor2)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, BinaryIO

LENGTH = struct.Struct("<L")


def sorted_value(value: Any, sort_keys: bool) -> Any:
    return {k: value[k] for k in sorted(value)} if sort_keys and isinstance(value, dict) else value


def dump(packb: Callable[[Any], bytes], value: Any, fp: BinaryIO, sort_keys: bool) -> None:
    packed = packb(sorted_value(value, sort_keys))
    fp.write(LENGTH.pack(len(packed)))
    fp.write(packed)


def load(unpackb: Callable[[bytes], Any], fp: BinaryIO) -> Any:
    (length,) = LENGTH.unpack(fp.read(LENGTH.size))
    return unpackb(fp.read(length))
