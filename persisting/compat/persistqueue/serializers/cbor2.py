"""CBOR (RFC 8949) through the ``cbor2`` package."""

from __future__ import annotations

from typing import Any, BinaryIO

import cbor2

from . import _prefixed


def _packb(value: Any) -> bytes:
    packed: bytes = cbor2.dumps(value)
    return packed


def dump(value: Any, fp: BinaryIO, sort_keys: bool = False) -> None:
    _prefixed.dump(_packb, value, fp, sort_keys)


def dumps(value: Any, sort_keys: bool = False) -> bytes:
    return _packb(_prefixed.sorted_value(value, sort_keys))


def load(fp: BinaryIO) -> Any:
    return _prefixed.load(loads, fp)


def loads(bytes_value: bytes) -> Any:
    return cbor2.loads(bytes_value)
