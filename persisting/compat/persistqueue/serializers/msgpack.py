"""msgpack (binary strings kept apart, tuples read back as lists' immutable twin as in persist-queue)."""

from __future__ import annotations

from typing import Any, BinaryIO

import msgpack

from . import _prefixed


def _packb(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def dump(value: Any, fp: BinaryIO, sort_keys: bool = False) -> None:
    _prefixed.dump(_packb, value, fp, sort_keys)


def dumps(value: Any, sort_keys: bool = False) -> bytes:
    return _packb(_prefixed.sorted_value(value, sort_keys))


def load(fp: BinaryIO) -> Any:
    return _prefixed.load(loads, fp)


def loads(bytes_value: bytes) -> Any:
    return msgpack.unpackb(bytes_value, use_list=False, raw=False)
