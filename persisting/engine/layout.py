"""How a topic sits on disk and how rows find their bucket and position: pure helpers for the engine.

Bucket of a row: crc32 of the canonical bytes of ``row[bucket_column]`` modulo ``num_buckets``; a row without
that key (or with ``None``) goes to ``global_index % num_buckets``. Exception: the samples of one tensor batch
that went through the broker's arena, when none has the bucket column, go to one bucket together
(``batch_bucket`` of the batch's first index), so its payload is written as whole columns.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptionError
from .wal import fsync_dir


def topic_dirname(name: str) -> str:
    """A folder name for a topic: injective (so topics never collide) and safe on every filesystem."""
    out = []
    for ch in name:
        if ch.isascii() and (ch.isalnum() or ch in "-_"):
            out.append(ch)
        else:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
    return "".join(out)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise CorruptionError(f"{path} is not valid JSON: {exc}") from exc


def bucket_of(value: Any, index: int, num_buckets: int) -> int:
    if value is None:
        return index % num_buckets
    if isinstance(value, bytes):
        key = value
    elif isinstance(value, str):
        key = value.encode("utf-8")
    else:
        key = repr(value).encode("ascii")  # bool, int, float: repr is stable across runs
    return zlib.crc32(key) % num_buckets


def batch_bucket(first_index: int, num_buckets: int) -> int:
    """The bucket of a whole tensor batch (broker arena batches without the bucket column): a hash of its first
    index, so batches of any fixed size still spread over the buckets."""
    return zlib.crc32(first_index.to_bytes(8, "little")) % num_buckets


class IndexColumn:
    """Sorted global indexes of one bucket, by position: a growable int64 array (8 bytes per row)."""

    def __init__(self, values: list[int] | None = None) -> None:
        self._data = np.asarray(values or [], dtype=np.int64)
        self._n = len(self._data)

    def __len__(self) -> int:
        return self._n

    def extend(self, values: list[int]) -> None:
        need = self._n + len(values)
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data), 1024), dtype=np.int64)
            grown[: self._n] = self._data[: self._n]
            self._data = grown
        self._data[self._n : need] = values
        self._n = need

    def view(self) -> np.ndarray:
        return self._data[: self._n]

    def last(self) -> int:
        return int(self._data[self._n - 1]) if self._n else -1
