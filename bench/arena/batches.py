"""The tensor batches the ``arena`` benchmark moves: their two shapes (6 MiB and 64 MiB), the random source pool a
producer cycles through, and the stamp that lets the consumer check each batch's order and content."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MiB = 1 << 20
POOL = 4  # distinct source batches per producer, used in turn (so the source is not one cache-hot array)


@dataclass(frozen=True, slots=True)
class Shape:
    key: str  # "6MiB" / "64MiB"
    rows: int  # samples per batch
    fields: tuple[tuple[str, str, int], ...]  # (name, dtype, per-sample length)

    @property
    def batch_bytes(self) -> int:
        return sum(self.rows * n * np.dtype(dt).itemsize for _name, dt, n in self.fields)

    @property
    def label(self) -> str:
        inner = " + ".join(f"{dt}[{n}]" for _name, dt, n in self.fields)
        return f"{self.rows} x ({inner})" if len(self.fields) > 1 else f"{self.rows} x {inner}"

    @property
    def names(self) -> list[str]:
        return [name for name, _dt, _n in self.fields]


SMALL = Shape("6MiB", 256, (("input_ids", "int64", 1024), ("logprobs", "float32", 4096)))
LARGE = Shape("64MiB", 64, (("x", "float32", 262144),))


def make_pool(shape: Shape, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(POOL):
        batch = {}
        for name, dt, n in shape.fields:
            if np.dtype(dt).kind == "i":
                batch[name] = rng.integers(0, 50_000, size=(shape.rows, n), dtype=dt)
            else:
                batch[name] = rng.standard_normal(size=(shape.rows, n), dtype=np.float32).astype(dt, copy=False)
        pool.append(batch)
    return pool


def stamp(batch: dict[str, Any], i: int) -> None:
    """Mark a source batch with its batch number (first element of the first field), in place."""
    first = next(iter(batch.values()))
    first[0, 0] = i


def stamp_of(batch: dict[str, Any]) -> int:
    return int(next(iter(batch.values()))[0, 0])


def read_all(batch: dict[str, Any]) -> int:
    """Read every byte of a received batch (an OR over 8-byte words): what a consumer that uses the data pays to
    fault its pages in, on top of the hand-over."""
    acc = 0
    for value in batch.values():
        flat = np.asarray(value).reshape(-1).view(np.uint8)
        words = flat[: flat.size // 8 * 8].view(np.uint64)
        acc |= int(np.bitwise_or.reduce(words)) if words.size else 0
    return acc
