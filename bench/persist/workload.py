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

from bench.common.arena_stream import SAMPLE_FLOATS, disk_gbps, stream_batch, stream_run
from bench.common.flush import flush_cost

MiB = 1024 * 1024


@dataclass
class PersistResult:
    stream_bytes: int = 0
    stream: dict[str, list[float]] = field(default_factory=dict)  # label -> GB/s per run ("disk": the reference)
    cores: dict[str, list[float]] = field(default_factory=dict)  # label -> the broker's CPU s / wall s per run
    pairs: list[int] = field(default_factory=list)  # the encoders of the broker run after each disk reference
    encoding: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # label -> (CPU s/GB, bytes) per run
    flush: list[Any] = field(default_factory=list)  # bench.flush.FlushResult per run


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
    batch = stream_batch(seed)
    batches = max(1, stream_factor * arena_bytes // batch.nbytes)
    result.stream_bytes = batches * batch.nbytes
    for run in range(runs):
        order = encoders if run % 2 == 0 else encoders[::-1]
        for n in order:
            os.sync()  # the previous case's dirty pages are not this one's
            result.stream.setdefault("disk", []).append(disk_gbps(base, batch, batches))
            result.pairs.append(n)
            os.sync()
            gbps, cores = stream_run(base, n, arena_bytes, batch, batches)
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
