"""``python -m bench.lance_read_cpu``: what a read after the flush costs in CPU, the broker's and the consumer's.

A batch of ``--gib`` (0.5) GiB (float32, samples of 16 MiB) is put through a broker whose arena is ``--arena-mib``
(256) MiB, flushed to Lance, then read back whole with ``get_data`` ``--gets`` (2) times by this process. For each
get: GB/s, and CPU seconds per GB of the broker (``/proc/<pid>/stat``) and of the consumer (``os.times``), which
say more than GB/s on a machine whose cores are shared (docs/benchmarks/multimodal-big.md, "After the flush").
Every byte is checked after each get.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common.broker_process import broker_process
from persisting import SyncQueue

SAMPLE_FLOATS = 4 * 1024 * 1024  # 16 MiB per sample, as bench.multimodal_big


def _cpu_s_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lance_read_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=0.5)
    parser.add_argument("--arena-mib", type=int, default=256)
    parser.add_argument("--gets", type=int, default=2)
    args = parser.parse_args(argv)
    n = max(2, int(args.gib * 2**30) // (SAMPLE_FLOATS * 4))
    x = np.random.default_rng(0).random((n, SAMPLE_FLOATS), dtype=np.float32)
    gb = x.nbytes / 1e9
    exact = True
    with tempfile.TemporaryDirectory(prefix="lrc-") as tmp:
        base = Path(tmp)
        address = f"ipc://{base}/b.sock"
        extra = ["--arena-bytes", str(args.arena_mib * 2**20)]
        with (
            broker_process(base / "s", address, base / "log", extra, "WARNING") as proc,
            SyncQueue("t", storage_path=base / "s", broker=address) as q,
        ):
            meta = q.put({"x": x}, partition_id="p")
            q.flush()  # the spool file is gone once Lance holds the batch: the read comes from Lance
            print(f"{gb:.2f} GB through a {args.arena_mib} MiB arena, read after the flush:")
            for _ in range(args.gets):
                b0, c0, w0 = _cpu_s_of(proc.pid), _own_cpu_s(), time.perf_counter()
                got = q.get_data(meta)
                b1, c1, w1 = _cpu_s_of(proc.pid), _own_cpu_s(), time.perf_counter()
                exact = exact and bool(np.array_equal(got["x"], x))
                broker, consumer = (b1 - b0) / gb, (c1 - c0) / gb
                print(
                    f"get {gb / (w1 - w0):.3f} GB/s; CPU s/GB broker {broker:.2f}, consumer {consumer:.2f}, "
                    f"total {broker + consumer:.2f}; exact: {exact}",
                    flush=True,
                )
                del got
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
