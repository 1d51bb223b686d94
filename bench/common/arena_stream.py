"""A sustained stream of float32 tensor batches through a broker, beyond its arena, and its reference: the same
bytes written to a plain file with ``os.write`` + ``os.fdatasync``. The ``persist`` suite and the ``multimodal``
suite's stream part both measure it: the arena fills, so the stream runs at the speed its batches leave for Lance.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.common.broker_process import broker_process, cpu_seconds
from bench.common.measure import synced_write_s
from persisting import Queue

MiB = 1024 * 1024
BATCH_ROWS = 16
SAMPLE_FLOATS = 256 * 1024  # 1 MiB of float32 per sample: a 16 MiB batch
PUT_TIMEOUT_S = 120.0


def stream_batch(seed: int) -> np.ndarray:
    """The batch every put of the stream sends: ``BATCH_ROWS`` samples of 1 MiB of float32."""
    return np.random.default_rng(seed).standard_normal((BATCH_ROWS, SAMPLE_FLOATS), dtype=np.float32)


def disk_gbps(folder: Path, batch: np.ndarray, batches: int) -> float:
    """GB/s of the plain file write + fdatasync (``measure.synced_write_s``) of ``batches`` x ``batch``."""
    data = batch.reshape(-1).view(np.uint8).data
    seconds = synced_write_s(folder / "fdatasync-reference.bin", (data for _ in range(batches)))
    return batch.nbytes * batches / seconds / 1e9


async def _produce(address: str, batch: np.ndarray, batches: int) -> float:
    q = Queue("stream", broker=address, durability="process")
    await q.open()
    try:
        await q.put({"x": batch[:1]}, partition_id="warm")  # the topic's creation is not timed
        await q.flush()
        t0 = time.perf_counter()
        for _ in range(batches):
            await q.put({"x": batch}, partition_id="p", timeout=PUT_TIMEOUT_S)
        await q.flush()
        seconds = time.perf_counter() - t0
        if len(q) != batches * BATCH_ROWS + 1:
            raise RuntimeError(f"the stream lost rows: {len(q)} stored of {batches * BATCH_ROWS + 1} put")
    finally:
        await q.aclose()
    return batch.nbytes * batches / seconds / 1e9


@contextlib.contextmanager
def _encoders_env(n: int) -> Iterator[None]:
    old = os.environ.get("PERSISTING_LANCE_ENCODERS")
    os.environ["PERSISTING_LANCE_ENCODERS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PERSISTING_LANCE_ENCODERS", None)
        else:
            os.environ["PERSISTING_LANCE_ENCODERS"] = old


def stream_run(base: Path, encoders: int, arena_bytes: int, batch: np.ndarray, batches: int) -> tuple[float, float]:
    """GB/s of the stream through a fresh broker with ``encoders`` Lance encoders, and the CPU cores the broker used
    meanwhile (CPU s / wall s)."""
    case = base / f"stream-{encoders}"
    (case / "s").mkdir(parents=True)
    address = f"ipc://{case / 's' / 'b.sock'}"
    try:
        with (
            _encoders_env(encoders),
            broker_process(
                case / "storage", address, base / "broker.log", ["--arena-bytes", str(arena_bytes)], "WARNING"
            ) as broker,
        ):
            cpu0, t0 = cpu_seconds(broker.pid) or 0.0, time.perf_counter()
            gbps = asyncio.run(_produce(address, batch, batches))
            cpu = (cpu_seconds(broker.pid) or 0.0) - cpu0
            return gbps, cpu / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(case, ignore_errors=True)
