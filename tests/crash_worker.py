"""A producer process for the kill -9 tests: puts records and reports each acknowledged batch on stdout.

Usage: python crash_worker.py PATH TOPIC DURABILITY BATCH_SIZE SEED MODE
MODE "serial": one coroutine, batches of random size, ids continue from len(queue).
MODE "concurrent": 8 coroutines putting at once; ids are <worker>:<n> strings, unique per run.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from persisting import Queue


async def main() -> None:
    path, topic, durability, batch_size, seed, mode = sys.argv[1:7]
    rng = random.Random(int(seed))
    q = Queue(topic, storage_path=path, batch_size=int(batch_size), durability=durability, num_buckets=3)
    await q.open()
    start = len(q)
    print(f"OPEN {start}", flush=True)
    if mode == "serial":
        next_id = start
        while True:
            n = rng.randint(1, 60)
            batch = [{"id": next_id + i, "pad": "x" * rng.randint(0, 200)} for i in range(n)]
            await q.put_batch(batch)
            os.write(1, f"ACK {next_id} {next_id + n}\n".encode())
            next_id += n
            if rng.random() < 0.05:
                await q.flush()
    else:
        run = os.getpid()

        async def worker(w: int) -> None:
            k = 0
            while True:
                n = rng.randint(1, 20)
                ids = [f"{run}:{w}:{k + i}" for i in range(n)]
                await q.put_batch([{"id": x, "w": w} for x in ids])
                os.write(1, ("ACKS " + " ".join(ids) + "\n").encode())
                k += n

        await asyncio.gather(*(worker(w) for w in range(8)))


asyncio.run(main())
