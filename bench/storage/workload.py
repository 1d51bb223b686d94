"""The workload of ``python -m bench storage``: flush and read throughput of a topic on a local S3 server (moto's,
a subprocess on 127.0.0.1) beside the same topic on local disk, in one run.

Per store and workload: ``put_batch`` of every record (acknowledged from the local log), then one timed
``flush()`` (the Lance appends: local files with fsync, or S3 PUTs); then a fresh ``Queue`` reads everything in
pages (for S3 with an empty ``local_path``: a fresh node reading what was flushed). Repeated ``--reps`` times on new
topics, the stores alternating. Workloads: small records (~100 B) and tensor records (one float32 array of
``--tensor-kib`` each).
moto keeps objects in its own process memory and serves them over HTTP on loopback, so the S3 figures show the
request path (HTTP, signing, Lance's object-store I/O), not a real network or a real bucket's latency.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.records import make_records
from persisting import Queue
from persisting.testing.s3_server import start_s3_server

NO_AUTO_FLUSH = 2**62
PUT_BATCH = 1_000
# A log frame over msgpack's default 100 MiB buffer does not replay (a limit of the engine's log today): tensor
# records go in puts of at most this much.
PUT_BATCH_BYTES = 32 * 1024 * 1024
READ_PAGE = 10_000


@dataclass
class StoreSeries:
    """One store and workload: its records' count and payload bytes, each rep's flush and read seconds."""

    store: str
    workload: str
    rows: int
    payload_bytes: int
    flush_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)


def _workloads(n_small: int, n_tensor: int, tensor_kib: int, seed: int) -> dict[str, tuple[list[dict[str, Any]], int]]:
    small = make_records(n_small, seed)
    small_bytes = sum(8 + len(r["text"]) + 8 for r in small)
    width = tensor_kib * 1024 // 4
    rng = np.random.default_rng(seed)
    tensors = [{"id": i, "x": rng.random(width, dtype=np.float32)} for i in range(n_tensor)]
    return {
        f"records ~100 B x {n_small:,}": (small, small_bytes),
        f"float32[{width}] x {n_tensor:,}": (tensors, n_tensor * width * 4),
    }


async def _one(
    store: str,
    records: list[dict[str, Any]],
    row_bytes: int,
    path: str,
    options: dict[str, Any],
    local: Path,
    name: str,
) -> tuple[float, float]:
    kw: dict[str, Any] = {"storage_options": options, "local_path": local / "writer"} if options else {}
    step = max(1, min(PUT_BATCH, PUT_BATCH_BYTES // max(1, row_bytes)))
    async with Queue(name, storage_path=path, batch_size=NO_AUTO_FLUSH, **kw) as q:
        for k in range(0, len(records), step):
            await q.put_batch(records[k : k + step])
        t0 = time.perf_counter()
        await q.flush()
        flush_s = time.perf_counter() - t0
    kw = {"storage_options": options, "local_path": local / "reader"} if options else {}
    t0 = time.perf_counter()
    async with Queue(name, storage_path=path, batch_size=NO_AUTO_FLUSH, **kw) as q:
        got = 0
        while got < len(records):
            page = await q.get(limit=READ_PAGE, offset=got)
            if not page:
                raise RuntimeError(f"{store}: read {got} of {len(records)} records back")
            got += len(page)
    read_s = time.perf_counter() - t0
    shutil.rmtree(local, ignore_errors=True)
    return flush_s, read_s


def run_storage_bench(
    base: Path, *, n_small: int, n_tensor: int, tensor_kib: int, reps: int, seed: int
) -> list[StoreSeries]:
    server = start_s3_server()
    try:
        bucket = server.new_bucket()
        series: list[StoreSeries] = []
        for workload, (records, nbytes) in _workloads(n_small, n_tensor, tensor_kib, seed).items():
            local = StoreSeries("local disk", workload, len(records), nbytes)
            s3 = StoreSeries("S3 (moto, loopback)", workload, len(records), nbytes)
            for rep in range(reps):  # alternate the stores so that they share the machine's noise
                name = f"w{len(series)}-{rep}"
                for target, path, options in (
                    (local, str(base / "disk"), {}),
                    (s3, f"s3://{bucket}/bench", server.options()),
                ):
                    flush_s, read_s = asyncio.run(
                        _one(target.store, records, nbytes // len(records), path, options, base / "local", name)
                    )
                    target.flush_s.append(flush_s)
                    target.read_s.append(read_s)
            series += [local, s3]
        return series
    finally:
        server.stop()
