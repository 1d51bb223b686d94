"""The per-item part of ``python -m bench pq``: persist-queue's own benchmark workload
(``benchmark/run_benchmark.py``: N items put, then N got, per class) for persist-queue 1.1.0 and for
``persisting.compat.persistqueue`` in the same run, one run per class, library and repetition. The floor of a
``sync`` put is measured in the same run: a write of one log frame's bytes and its fdatasync, into a file that
grows with it and into room allocated ahead (what the write-ahead log does).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import persisting.compat.persistqueue as compat

ITEM = "x" * 100
CLASSES = ("Queue", "SQLiteQueue", "FILOSQLiteQueue", "UniqueQ", "SQLiteAckQueue")
DURABILITIES = ("process", "sync")
FLOOR_WRITES = 500  # write + fdatasync pairs per floor measurement
FRAME_BYTES = 160  # one put's log frame: 24 bytes of frame header, the batch header and a ~100-byte item


def fdatasync_floor(folder: Path, n: int) -> dict[str, float]:
    """Microseconds per write + fdatasync of FRAME_BYTES (the median of ``n``, a distribution within one rep):
    growing the file ("grow"), and into room allocated ahead ("ahead")."""
    frame = b"x" * FRAME_BYTES
    out = {}
    for label, ahead in (("grow", False), ("ahead", True)):
        fd = os.open(folder / f"floor-{label}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if ahead:
                os.posix_fallocate(fd, 0, n * FRAME_BYTES)
                os.fsync(fd)
            times = []
            for i in range(n):
                t0 = time.perf_counter()
                os.pwrite(fd, frame, i * FRAME_BYTES)
                os.fdatasync(fd)
                times.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
        out[label] = statistics.median(times) * 1e6
    return out


def one(module: Any, cls: str, path: str, n: int, extra: dict[str, Any]) -> tuple[float, float]:
    q = getattr(module, cls)(path, **extra)
    t0 = time.perf_counter()
    for i in range(n):
        q.put(f"{ITEM}{i}")
    t1 = time.perf_counter()
    for _ in range(n):
        v = q.get()
        if cls == "Queue":
            q.task_done()
        elif cls == "SQLiteAckQueue":
            q.ack(v)
    t2 = time.perf_counter()
    if hasattr(q, "close"):
        q.close()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def run_items(base: Path, n: int, reps: int, say: Callable[[str], None]) -> ItemsResult:
    """Every class, ``reps`` times, the libraries alternating within each rep: microseconds per put and per get."""
    import persistqueue

    result = ItemsResult()
    for cls in CLASSES:
        say(f"per item: {cls}")
        for r in range(reps):
            result.add(cls, "persist-queue", one(persistqueue, cls, str(base / f"pq-{cls}-{r}"), n, {}))
            for durability in DURABILITIES:
                path = str(base / f"ours-{durability}-{cls}-{r}")
                result.add(cls, library(durability), one(compat, cls, path, n, {"durability": durability}))
            floor = fdatasync_floor(base, min(n, FLOOR_WRITES))
            result.floor_us.setdefault("grow", []).append(floor["grow"])
            result.floor_us.setdefault("ahead", []).append(floor["ahead"])
    return result


def library(durability: str) -> str:
    return f"persisting durability={durability}"


@dataclass(slots=True)
class ItemsResult:
    """(class, library) -> the (put us, get us) of each rep; the fdatasync floor's us of each rep."""

    runs: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    floor_us: dict[str, list[float]] = field(default_factory=dict)

    def add(self, cls: str, lib: str, put_get_us: tuple[float, float]) -> None:
        self.runs.setdefault((cls, lib), []).append(put_get_us)
