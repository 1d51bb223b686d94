"""A producer for the kill -9 test of parallel flushes: tensor batches whose appends go to Lance through several
encoders (pieces of 64 KiB and up get their own fragment here), flushed often; each acknowledged batch is reported.

Usage: python parallel_flush_worker.py PATH SEED
Row ``i`` carries ``id = i`` and ``x = float32[1024]`` filled with ``i``: what is stored can be checked row by row.
"""

from __future__ import annotations

import os

os.environ["PERSISTING_LANCE_MIN_ENCODER_BYTES"] = str(64 * 1024)  # before persisting is imported

import asyncio
import random
import sys

import numpy as np

from persisting import Queue

SAMPLE_FLOATS = 1024


async def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    q = Queue("p", storage_path=path, batch_size=200, num_buckets=2, backend_options={"encoders": 4})
    await q.open()
    next_id = len(q)
    print(f"OPEN {next_id}", flush=True)
    while True:
        n = rng.randint(16, 160)
        ids = np.arange(next_id, next_id + n, dtype=np.int64)
        x = np.repeat(ids.astype(np.float32)[:, None], SAMPLE_FLOATS, axis=1)
        await q.put({"x": x, "id": ids.tolist()}, partition_id="p")
        os.write(1, f"ACK {next_id} {next_id + n}\n".encode())
        next_id += n
        if rng.random() < 0.3:
            await q.flush()


asyncio.run(main())
