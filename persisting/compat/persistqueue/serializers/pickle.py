"""Pickle, protocol 4 (persist-queue's default serializer). Only unpickle data written by parties you trust:
see "Trust model" in the docs (Guides, "persist-queue compatibility")."""

from __future__ import annotations

import pickle
from typing import Any, BinaryIO

protocol = 4


def _sorted(value: Any, sort_keys: bool) -> Any:
    return {k: value[k] for k in sorted(value)} if sort_keys and isinstance(value, dict) else value


def dump(value: Any, fp: BinaryIO, sort_keys: bool = False) -> None:
    pickle.dump(_sorted(value, sort_keys), fp, protocol=protocol)


def dumps(value: Any, sort_keys: bool = False) -> bytes:
    return pickle.dumps(_sorted(value, sort_keys), protocol=protocol)


def load(fp: BinaryIO) -> Any:
    return pickle.load(fp)


def loads(bytes_value: bytes) -> Any:
    return pickle.loads(bytes_value)
