"""The demo: an embedded queue on ./data, a producer and a consumer coroutine, a reopen.

Run with ``./dev demo`` (or ``python -m persisting.demo [--storage-path DIR] [--records N]``).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from . import Queue, SyncQueue


async def demo(storage_path: str, n_records: int) -> None:
    topic = "demo-rollouts"
    async with Queue(topic, storage_path=storage_path, batch_size=1000) as q:
        start = len(q)
        print(f"topic {topic!r} under {storage_path}: {start} records from earlier runs")

        received = 0

        async def consumer() -> None:
            nonlocal received
            # Waits on a notification (no polling) and stops once 1 s passes with nothing new.
            async for chunk in q.stream(offset=start, wait=True, timeout=1.0):
                received += len(chunk)

        consuming = asyncio.create_task(consumer())
        t0 = time.perf_counter()
        for first in range(0, n_records, 1000):
            batch = [
                {"id": start + i, "prompt": f"what is {i}+{i}?", "response": str(2 * i), "reward": (i % 7) / 7}
                for i in range(first, min(first + 1000, n_records))
            ]
            await q.put_batch(batch)  # returns once the batch is fdatasync'ed in the write-ahead log
        put_s = time.perf_counter() - t0
        await q.flush()
        flush_s = time.perf_counter() - t0 - put_s
        await consuming
        print(
            f"put {n_records} records durably in {put_s:.3f} s ({n_records / put_s:,.0f} records/s), "
            f"flushed to Lance in {flush_s:.3f} s"
        )
        print(f"a consumer streaming with wait=True received {received} of them as they arrived")
        t0 = time.perf_counter()
        rows = await q.get(limit=n_records, offset=start)
        read_s = time.perf_counter() - t0
        print(f"read back {len(rows)} records in {read_s:.3f} s; first: {rows[0] if rows else None}")
        stats = await q.stats()
        per_bucket = [b["total_count"] for b in stats["buckets"]]
        print(f"stats: total {stats['total_count']}, per bucket {per_bucket}, fields {stats['fields']}")

    with SyncQueue(topic, storage_path=storage_path) as sq:
        print(f"reopened with SyncQueue: {len(sq)} records, next global index {sq.stats()['next_index']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--storage-path", default="./data")
    parser.add_argument("--records", type=int, default=50_000)
    args = parser.parse_args()
    asyncio.run(demo(args.storage_path, args.records))


if __name__ == "__main__":
    main()
