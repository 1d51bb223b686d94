"""``python -m bench lance-read-apis``: what each of pylance's read calls costs per GB on one dense tensor column.

A batch of ``--gib`` (0.5) GiB (float32, samples of 16 MiB) is put into an embedded topic and flushed, so Lance
holds it as the engine writes it (a fixed-shape tensor column, one sample per fragment at this size). Then the
column is read whole, in pieces of 4 samples (64 MiB, the pieces of a big get), by each read call: CPU seconds
of this process (Lance's threads included) per GB and GB/s, ``--reps`` (3) times each, alternating. Reference in
the same run: the dataset's data files read with plain ``read`` calls. (docs/benchmarks/multimodal-big.md)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lance
import numpy as np

from persisting import SyncQueue
from persisting.storage.lance_dense import take_by_fragment

SAMPLE_FLOATS = 4 * 1024 * 1024  # 16 MiB per sample, as bench.multimodal_big
PIECE_SAMPLES = 4  # 64 MiB: tensors/pieces.PIECE_BYTES
READ_CHUNK_BYTES = 64 * 1024 * 1024


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
        "plain read of the data files (reference)": plain,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lance_read_apis", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=0.5)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    n = max(PIECE_SAMPLES, int(args.gib * 2**30) // (SAMPLE_FLOATS * 4))
    x = np.random.default_rng(0).random((n, SAMPLE_FLOATS), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="lra-") as tmp:
        with SyncQueue("t", storage_path=Path(tmp)) as q:
            q.put({"x": x}, partition_id="p")
            q.flush()
        (where,) = Path(tmp).glob("t/bucket-*.lance")
        ds = lance.dataset(str(where))
        readers = _readers(ds, sorted((where / "data").glob("*.lance")))
        cpu: dict[str, list[float]] = {name: [] for name in readers}
        gbps: dict[str, list[float]] = {name: [] for name in readers}
        for _ in range(args.reps):
            for name, read in readers.items():
                c0, w0 = _cpu_s(), time.perf_counter()
                gb = read() / 1e9
                c1, w1 = _cpu_s(), time.perf_counter()
                cpu[name].append((c1 - c0) / gb)
                gbps[name].append(gb / (w1 - w0))
    print(f"lance {lance.__version__}: {x.nbytes / 2**30:.2f} GiB float32 column, read in pieces of 64 MiB")
    print(f"(median of {args.reps}, alternating)\n")
    print("| read | CPU s/GB (median) | runs | GB/s (median) |")
    print("|---|---:|---|---:|")
    for name in readers:
        runs = ", ".join(f"{v:.2f}" for v in cpu[name])
        print(f"| {name} | {statistics.median(cpu[name]):.2f} | {runs} | {statistics.median(gbps[name]):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
