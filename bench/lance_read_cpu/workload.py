"""The workload of ``python -m bench lance-read-cpu``: what a read after the flush costs in CPU, the broker's and the
consumer's.

A batch of ``--gib`` (0.5) GiB (float32, samples of 16 MiB) is put through a broker whose arena is ``--arena-mib``
(256) MiB, flushed to Lance, then read back whole with ``get_data`` ``--reps`` (2) times by this process. For each
get: GB/s, and CPU seconds per GB of the broker (``/proc/<pid>/stat``) and of the consumer (``os.times``), which
say more than GB/s on a machine whose cores are shared (docs/benchmarks/multimodal-big.md, "After the flush").
Every byte is checked after each get.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from bench.common.broker_process import broker_process, cpu_seconds
from persisting import SyncQueue

SAMPLE_FLOATS = 4 * 1024 * 1024  # 16 MiB per sample, as the multimodal suite's big batch


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run(work: Path, gib: float, arena_mib: int, reps: int, seed: int) -> tuple[dict[str, list[float]], int]:
    """Per get: GB/s, the broker's, the consumer's and their total CPU s/GB; and the batch's bytes. A byte that
    differs after a get raises."""
    n = max(2, int(gib * 2**30) // (SAMPLE_FLOATS * 4))
    x = np.random.default_rng(seed).random((n, SAMPLE_FLOATS), dtype=np.float32)
    gb = x.nbytes / 1e9
    out: dict[str, list[float]] = {"GB/s": [], "broker": [], "consumer": [], "total": []}
    address = f"ipc://{work}/b.sock"
    extra = ["--arena-bytes", str(arena_mib * 2**20)]
    with (
        broker_process(work / "s", address, work / "log", extra, "WARNING") as proc,
        SyncQueue("t", storage_path=work / "s", broker=address) as q,
    ):
        meta = q.put({"x": x}, partition_id="p")
        q.flush()  # the spool file is gone once Lance holds the batch: the read comes from Lance
        for i in range(reps):
            b0, c0, w0 = cpu_seconds(proc.pid) or 0.0, _own_cpu_s(), time.perf_counter()
            got = q.get_data(meta)
            b1, c1, w1 = cpu_seconds(proc.pid) or 0.0, _own_cpu_s(), time.perf_counter()
            if not np.array_equal(got["x"], x):
                raise RuntimeError(f"get {i + 1} read other bytes than were put")
            del got
            broker, consumer = (b1 - b0) / gb, (c1 - c0) / gb
            for key, value in (("GB/s", gb / (w1 - w0)), ("broker", broker), ("consumer", consumer)):
                out[key].append(value)
            out["total"].append(broker + consumer)
    return out, x.nbytes
