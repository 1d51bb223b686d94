"""The workload of ``python -m bench lance-read-apis``: what each of pylance's read calls costs per GB on one dense
tensor column.

A batch of ``--gib`` (0.5) GiB (float32, samples of 16 MiB) is put into an embedded topic and flushed, so Lance
holds it as the engine writes it (a fixed-shape tensor column, one sample per fragment at this size). Then the
column is read whole, in pieces of 4 samples (64 MiB, the pieces of a big get), by each read call: CPU seconds
of this process (Lance's threads included) per GB and GB/s, ``--reps`` (3) times each, alternating. Reference in
the same run (``PLAIN``): the dataset's data files read with plain ``read`` calls. (docs/benchmarks/multimodal-big.md)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import lance
import numpy as np

from persisting import SyncQueue
from persisting.storage.lance_dense import take_by_fragment

SAMPLE_FLOATS = 4 * 1024 * 1024  # 16 MiB per sample, as the multimodal suite's big batch
PIECE_SAMPLES = 4  # 64 MiB: tensors/pieces.PIECE_BYTES
READ_CHUNK_BYTES = 64 * 1024 * 1024
PLAIN = "plain read of the data files"


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _readers(ds: lance.LanceDataset, files: list[Path]) -> dict[str, Callable[[], int]]:
    n = ds.count_rows()
    pieces = [np.arange(a, min(a + PIECE_SAMPLES, n)) for a in range(0, n, PIECE_SAMPLES)]

    def plain() -> int:
        total = 0
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while chunk := f.read(READ_CHUNK_BYTES):
                    total += len(chunk)
        return total

    return {
        PLAIN: plain,
        "LanceDataset.take (the read before this change)": lambda: sum(
            ds.take(p, columns=["x"]).nbytes for p in pieces
        ),
        "LanceDataset.to_table(offset, limit)": lambda: sum(
            ds.to_table(columns=["x"], offset=int(p[0]), limit=len(p)).nbytes for p in pieces
        ),
        "LanceFragment.to_batches": lambda: sum(
            b.nbytes for f in ds.get_fragments() for b in f.to_batches(columns=["x"], batch_size=PIECE_SAMPLES)
        ),
        "LanceFragment.take per fragment (lance_dense.take_by_fragment)": lambda: sum(
            take_by_fragment(ds, p, ["x"]).nbytes for p in pieces
        ),
    }


def _all_buckets(topic: Path) -> dict[str, Callable[[], int]]:
    """Each read call over every bucket of the topic that holds rows (the engine spreads samples over buckets)."""
    per_bucket = []
    for where in sorted(topic.glob("bucket-*.lance")):
        ds = lance.dataset(str(where))
        if ds.count_rows():
            per_bucket.append(_readers(ds, sorted((where / "data").glob("*.lance"))))
    if not per_bucket:
        raise RuntimeError(f"no bucket of {topic} holds the batch after the flush")
    return {name: _summed([r[name] for r in per_bucket]) for name in per_bucket[0]}


def _summed(reads: list[Callable[[], int]]) -> Callable[[], int]:
    return lambda: sum(read() for read in reads)


def run(work: Path, gib: float, reps: int, seed: int) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Read call -> CPU s/GB per rep, read call -> GB/s per rep, and the column's bytes."""
    n = max(PIECE_SAMPLES, int(gib * 2**30) // (SAMPLE_FLOATS * 4))
    x = np.random.default_rng(seed).random((n, SAMPLE_FLOATS), dtype=np.float32)
    with SyncQueue("t", storage_path=work) as q:
        q.put({"x": x}, partition_id="p")
        q.flush()
    readers = _all_buckets(work / "t")
    cpu: dict[str, list[float]] = {name: [] for name in readers}
    gbps: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(reps):
        for name, read in readers.items():
            c0, w0 = _cpu_s(), time.perf_counter()
            gb = read() / 1e9
            c1, w1 = _cpu_s(), time.perf_counter()
            cpu[name].append((c1 - c0) / gb)
            gbps[name].append(gb / (w1 - w0))
    return cpu, gbps, x.nbytes
