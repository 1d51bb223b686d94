"""The demo: an embedded queue on ./data, then a broker on the same storage with producer and consumer processes
(records, tensor batches through the arena, and an RL step: ``demo/rl.py``).

Run with ``./dev demo`` (or ``python -m persisting.demo [--storage-path DIR] [--records N]``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from .. import Queue, SyncQueue
from . import rl as demo_rl


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


async def produce(address: str, worker: int, n: int) -> None:
    async with Queue("demo-broker", broker=address) as q:
        for start in range(0, n, 100):
            await q.put_batch([{"id": f"{worker}:{i}", "reward": i / n} for i in range(start, min(n, start + 100))])


async def consume(address: str, offset: int, n: int) -> None:
    seen = 0
    async with Queue("demo-broker", broker=address) as q:
        async for chunk in q.stream(offset=offset, wait=True, timeout=5.0):
            seen += len(chunk)
            if seen >= n:
                break
    print(f"  consumer {os.getpid()}: read {seen} records", flush=True)


TENSOR_TOPIC = "demo-tensors"
SAMPLES_PER_BATCH = 256


def _tensor_batch(k: int) -> dict[str, Any]:
    # 256 x (int64[1024] + float32[4096]) = 6 MiB, the shape of a batch of rollouts with their logprobs
    ids = np.full((SAMPLES_PER_BATCH, 1024), k, dtype=np.int64)
    return {"input_ids": ids, "logprobs": np.full((SAMPLES_PER_BATCH, 4096), k, dtype=np.float32)}


async def produce_tensors(address: str, batches: int) -> None:
    async with Queue(TENSOR_TOPIC, broker=address, batch_size=4096) as q:
        for k in range(batches):
            await q.put(_tensor_batch(k), partition_id="step-0")  # written once, into shared memory


async def consume_tensors(address: str, batches: int) -> None:
    async with Queue(TENSOR_TOPIC, broker=address, batch_size=4096) as q:
        got = 0
        t0 = 0.0
        while got < batches * SAMPLES_PER_BATCH:
            meta = await q.get_meta(["input_ids", "logprobs"], SAMPLES_PER_BATCH, "train", "step-0")
            if meta.size == 0:
                await asyncio.sleep(0.0005)
                continue
            if not got:
                t0 = time.perf_counter()  # from the first batch: process start-up is not transfer time
            data = await q.get_data(meta)  # copy-on-write views of the broker's arena: no copy
            if not (data["input_ids"][:, 0] == data["logprobs"][:, 0]).all():
                raise SystemExit("demo: a batch came back wrong")
            got += meta.size
            del data  # views released: the broker may reuse the space once the batch is in Lance
        elapsed = time.perf_counter() - t0
        moved = (await q.stats())["zerocopy"]
    nbytes = (batches - 1) * sum(a.nbytes for a in _tensor_batch(0).values())  # the clock started after one
    src, dst = np.ones(nbytes // 8, np.int64), np.ones(nbytes // 8, np.int64)  # both faulted in already
    t1 = time.perf_counter()
    np.copyto(dst, src)
    memcpy_s = time.perf_counter() - t1
    print(
        f"  consumer {os.getpid()}: {batches} tensor batches; {nbytes / 2**20:.0f} MiB after the first "
        f"in {elapsed:.2f} s, "
        f"{nbytes / elapsed / 1e9:.2f} GB/s; a memcpy of the same bytes here: {nbytes / memcpy_s / 1e9:.2f} GB/s; "
        f"{moved['get_zero_copy_bytes'] / 2**20:.0f} MiB handed over as views, "
        f"{moved['get_copied_bytes'] / 2**20:.0f} MiB copied",
        flush=True,
    )


def broker_demo(storage_path: str, n_per_producer: int) -> None:
    folder = tempfile.mkdtemp(prefix="persisting-demo-")
    address = f"ipc://{folder}/broker.sock"
    broker = subprocess.Popen(
        [sys.executable, "-m", "broker", "--storage-path", storage_path, "--socket", address, "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert broker.stdout is not None
    t0 = time.perf_counter()
    print(broker.stdout.readline().strip(), f"({(time.perf_counter() - t0) * 1000:.0f} ms)")
    try:
        with SyncQueue("demo-broker", broker=address) as q:
            offset = len(q)
        me = [sys.executable, "-m", "persisting.demo", "--worker"]
        t0 = time.perf_counter()
        consumers = [
            subprocess.Popen([*me, "consume", address, str(offset), str(2 * n_per_producer)]) for _ in range(2)
        ]
        producers = [subprocess.Popen([*me, "produce", address, str(w), str(n_per_producer)]) for w in range(2)]
        for p in producers:
            p.wait()
        produced_s = time.perf_counter() - t0
        for c in consumers:
            c.wait()
        total = 2 * n_per_producer
        print(
            f"2 producer processes put {total} records durably through the broker in {produced_s:.2f} s "
            f"({total / produced_s:,.0f} records/s); 2 consumer processes each streamed all of them "
            f"({time.perf_counter() - t0:.2f} s end to end)"
        )
        batches = 40
        print(f"a producer process streams {batches} tensor batches to a consumer process through the arena:")
        consumer = subprocess.Popen([*me, "tensor-consume", address, str(batches), "0"])
        producer = subprocess.Popen([*me, "tensor-produce", address, str(batches), "0"])
        if producer.wait() != 0 or consumer.wait() != 0:
            raise SystemExit("demo: the tensor producer or consumer failed")
        print("an RL step: a rollout process, a reward process adding a field, 2 trainer ranks taking GRPO groups:")
        demo_rl.run(address)
    finally:
        broker.send_signal(signal.SIGTERM)
        code = broker.wait(timeout=120)
        print(f"broker stopped with exit code {code} (it flushed every topic first)")
        os.rmdir(folder)  # the broker removed its socket file


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        role, address, a, b = sys.argv[2:6]
        workers = {
            "produce": lambda: produce(address, int(a), int(b)),
            "consume": lambda: consume(address, int(a), int(b)),
            "tensor-produce": lambda: produce_tensors(address, int(a)),
            "tensor-consume": lambda: consume_tensors(address, int(a)),
        }
        asyncio.run(workers[role]())
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--storage-path", default="./data")
    parser.add_argument("--records", type=int, default=50_000)
    args = parser.parse_args()
    print("== embedded mode ==")
    asyncio.run(demo(args.storage_path, args.records))
    print("== broker mode ==")
    broker_demo(args.storage_path, args.records // 2)


if __name__ == "__main__":
    main()
