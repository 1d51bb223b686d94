"""The ``persist`` suite's workload: how fast tensor batches leave the arena for Lance, against the disk, in one run.

1. Sustained stream: one producer ``put``s float32 tensor batches worth ``--stream-factor`` (4) times the broker's
   arena (``--arena-mib``, 256) through the broker (``durability="process"``, no consumer), then ``flush()``:
   the arena fills, so the stream runs at the speed its batches leave for Lance. GB/s = payload bytes / (first put
   -> flush returned, every row committed to Lance and fsync'ed). One broker per run, with
   ``PERSISTING_LANCE_ENCODERS`` = 1, 2 and every core. Reference in the same run, before each broker run: the same
   bytes written to a plain file beside the broker's storage with ``os.write`` and ``os.fdatasync`` every 64 MiB.
2. Encoding settings: the same tensor table (``--table-mib``) written by one ``lance.write_dataset`` with the
   column's default encoding and with ``lance-encoding:compression=none``: CPU seconds per GB and bytes on disk.
3. Flush cost against stored data (bench/common/flush.py): one flush of 1,000 rows into an empty topic vs into a topic
   holding ``--flush-prefill`` rows; p50 and p90 of 20 flushes each.

Every figure is the median of ``--reps`` (3) runs; cases alternate within a run to share the machine's noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from bench.common.broker_process import broker_process
from bench.common.flush import flush_cost
from persisting import Queue

MiB = 1024 * 1024
BATCH_ROWS = 16
SAMPLE_FLOATS = 256 * 1024  # 1 MiB of float32 per sample: a 16 MiB batch
SYNC_EVERY_BYTES = 64 * MiB
PUT_TIMEOUT_S = 120.0


@dataclass
class PersistResult:
    stream_bytes: int = 0
    stream: dict[str, list[float]] = field(default_factory=dict)  # label -> GB/s per run ("disk": the reference)
    cores: dict[str, list[float]] = field(default_factory=dict)  # label -> the broker's CPU s / wall s per run
    pairs: list[int] = field(default_factory=list)  # the encoders of the broker run after each disk reference
    encoding: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # label -> (CPU s/GB, bytes) per run
    flush: list[Any] = field(default_factory=list)  # bench.flush.FlushResult per run


def _batch(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH_ROWS, SAMPLE_FLOATS), dtype=np.float32)


def _disk(folder: Path, batch: np.ndarray, batches: int) -> float:
    """GB/s of the plain file write + fdatasync of ``batches`` x ``batch``."""
    path = folder / "fdatasync-reference.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    data = batch.reshape(-1).view(np.uint8).data
    try:
        t0 = time.perf_counter()
        unsynced = 0
        for _ in range(batches):
            os.write(fd, data)
            unsynced += batch.nbytes
            if unsynced >= SYNC_EVERY_BYTES:
                os.fdatasync(fd)
                unsynced = 0
        os.fdatasync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
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
        assert len(q) == batches * BATCH_ROWS + 1, "the stream lost rows"
    finally:
        await q.aclose()
    return batch.nbytes * batches / seconds / 1e9


@contextlib.contextmanager
def _encoders_env(n: int) -> Any:
    old = os.environ.get("PERSISTING_LANCE_ENCODERS")
    os.environ["PERSISTING_LANCE_ENCODERS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PERSISTING_LANCE_ENCODERS", None)
        else:
            os.environ["PERSISTING_LANCE_ENCODERS"] = old


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stream_run(base: Path, encoders: int, arena_bytes: int, batch: np.ndarray, batches: int) -> tuple[float, float]:
    """GB/s of the stream, and the CPU cores the broker used meanwhile (CPU s / wall s)."""
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
            cpu0, t0 = _cpu_seconds(broker.pid), time.perf_counter()
            gbps = asyncio.run(_produce(address, batch, batches))
            return gbps, (_cpu_seconds(broker.pid) - cpu0) / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(case, ignore_errors=True)


def _encoding_run(base: Path, table_bytes: int, seed: int) -> dict[str, tuple[float, int]]:
    rows = max(1, table_bytes // (SAMPLE_FLOATS * 4))
    x = np.random.default_rng(seed).standard_normal((rows, SAMPLE_FLOATS), dtype=np.float32)
    column = pa.FixedShapeTensorArray.from_numpy_ndarray(x)
    out: dict[str, tuple[float, int]] = {}
    cases: list[tuple[str, dict[str, str] | None]] = [
        ("default", None),
        ("compression=none", {"lance-encoding:compression": "none"}),
    ]
    for label, meta in cases if seed % 2 == 0 else cases[::-1]:  # alternate which goes first (warm caches)
        table = pa.Table.from_arrays([column], schema=pa.schema([pa.field("x", column.type, metadata=meta)]))
        path = base / f"encoding-{label}.lance"
        c0 = time.process_time()
        lance.write_dataset(table, str(path))
        cpu = time.process_time() - c0
        size = sum(f.stat().st_size for f in (path / "data").iterdir())
        out[label] = (cpu / x.nbytes * 1e9, size)
        shutil.rmtree(path)
    return out


def run_persist_bench(
    base: Path,
    *,
    arena_mib: int,
    stream_factor: int,
    encoders: list[int],
    table_mib: int,
    flush_prefill: int,
    runs: int,
    seed: int,
    progress: bool,
) -> PersistResult:
    result = PersistResult()
    arena_bytes = arena_mib * MiB
    batch = _batch(seed)
    batches = max(1, stream_factor * arena_bytes // batch.nbytes)
    result.stream_bytes = batches * batch.nbytes
    for run in range(runs):
        order = encoders if run % 2 == 0 else encoders[::-1]
        for n in order:
            os.sync()  # the previous case's dirty pages are not this one's
            result.stream.setdefault("disk", []).append(_disk(base, batch, batches))
            result.pairs.append(n)
            os.sync()
            gbps, cores = _stream_run(base, n, arena_bytes, batch, batches)
            result.stream.setdefault(f"encoders={n}", []).append(gbps)
            result.cores.setdefault(f"encoders={n}", []).append(cores)
            if progress:
                print(f"run {run + 1}/{runs}: {n} encoders {gbps:.2f} GB/s, broker {cores:.2f} cores", file=sys.stderr)
        for label, figures in _encoding_run(base, table_mib * MiB, seed + run).items():
            result.encoding.setdefault(label, []).append(figures)
        if flush_prefill:
            folder = base / f"flush-{run}"
            folder.mkdir()
            result.flush.append(flush_cost(folder, flush_prefill, 20, seed + run, lambda n: None))
            shutil.rmtree(folder, ignore_errors=True)
    return result
