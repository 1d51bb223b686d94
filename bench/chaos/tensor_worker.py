"""A client process of the tensor scenario of ``python -m bench chaos`` (``tensor_kills.py``): it runs while the
broker is SIGKILLed and restarted under it.

    python -m bench.chaos.tensor_worker ADDRESS produce WORKER SEED STOP_FILE   put tensor batches until STOP_FILE
    python -m bench.chaos.tensor_worker ADDRESS consume WORKER SEED STOP_FILE   take them (delivery="ack") until then

A producer puts batches of 8 samples (6 MiB: past half of the 8 MiB arena) and of 1 sample (768 KiB), in a seeded
mix, to topic ``chaos-big`` (one bucket, partition ``p``), so that the bucket's fragments are small and big in
turn and its compaction (the broker's ``compact_min_fragments = 2``) rewrites runs of small ones between big ones;
both pause in the same short window of every second (a step boundary), where compactions commit.
Each sample's ``x`` is ``sample(id)`` (uint32, every element depends on the id and its position: a sample shifted,
cut or swapped with another reads differently). It prints ``ACK <id> ...`` once a put returned; a put that raises
``BrokerUnavailableError`` is sent again with the key the error carries (stored once whatever the first did).
A consumer takes batches with acknowledged delivery, checks every element, prints ``GOT``/``DONE`` (``CORRUPT``
for a sample that differs).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

from persisting import BrokerUnavailableError, Queue

from .worker import _again, _opened, _retrying, _say

TOPIC = "chaos-big"
SAMPLE_ELEMENTS = 192 * 1024  # uint32: 768 KiB per sample, 6 MiB per batch of 8
BIG, SMALL = 8, 1
LEASE_SECONDS = 10.0
# Producers put in steps, as an RL loop does: both are idle for the same IDLE_S of every STEP_S (wall clock), so
# the broker's flushes stop then and a compaction's commit lands (one that an append overtakes is deferred).
STEP_S, IDLE_S = 1.0, 0.5


def sample(i: int) -> np.ndarray:
    """The content of sample ``i``: a multiplicative hash of its position, offset by the id."""
    return (np.arange(SAMPLE_ELEMENTS, dtype=np.uint32) * np.uint32(2654435761)) + np.uint32(i & 0xFFFFFFFF)


def _queue(address: str) -> Queue:
    return Queue(TOPIC, broker=address, num_buckets=1)


async def produce(address: str, worker: int, seed: int, stop: Path) -> None:
    rng = random.Random(seed)
    async with await _opened(_queue(address)) as q:
        n = 0
        while not stop.exists():
            idle = IDLE_S - time.time() % STEP_S
            if idle > 0:
                await asyncio.sleep(idle)
            size = BIG if rng.random() < 0.4 else SMALL
            first = (worker * 10_000_000 + n) * BIG  # below 2**32: a sample's content offsets by it
            ids = list(range(first, first + size))
            x = np.stack([sample(i) for i in ids])
            await _retrying(q.put, {"x": x, "id": np.array(ids, dtype=np.int64)}, partition_id="p")
            _say("ACK", ids)
            n += 1


async def consume(address: str, stop: Path) -> None:
    async with await _opened(_queue(address)) as q:
        while not stop.exists():
            data, meta = await _again(
                q.get_batch,
                ["x", "id"],
                batch_size=8,
                partition_id="p",
                task_name="train",
                delivery="ack",
                lease_seconds=LEASE_SECONDS,
            )
            if meta.size == 0:
                await asyncio.sleep(0.05)
                continue
            ids = [int(i) for i in np.asarray(data["id"])]
            x = np.asarray(data["x"])
            bad = [i for row, i in enumerate(ids) if not np.array_equal(x[row], sample(i))]
            if bad:
                _say("CORRUPT", bad)
            _say("GOT", ids)
            del data, x
            await _again(q.mark_consumed, "train", meta, partition_id="p")
            _say("DONE", ids)


def main() -> None:
    address, role, worker, seed, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    try:
        asyncio.run(produce(address, worker, seed, stop) if role == "produce" else consume(address, stop))
    except BrokerUnavailableError:
        os.write(2, b"the broker did not come back\n")
        raise


if __name__ == "__main__":
    main()
