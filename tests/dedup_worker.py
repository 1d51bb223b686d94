"""A producer for the dedup crash test. Usage: python dedup_worker.py ADDRESS TOPIC START:N

Puts GRPO-like batches b = START..START+N-1 with dedup on: 2 prompts x 3 responses, prompt images that repeat
inside a batch and across batches (``image(b // 2 + k)``), token ids ``b * 6 + sample``; prints ACK b after
each acknowledged put."""

from __future__ import annotations

import asyncio
import sys

import numpy as np

from persisting import Queue

PROMPTS, RESPONSES = 2, 3


def image(i: int) -> np.ndarray:
    return np.random.default_rng(i).random((4, 64, 64), dtype=np.float32)


def batch(b: int) -> dict[str, np.ndarray]:
    images = np.stack([image(b // 2 + k) for k in range(PROMPTS)])
    return {
        "img": np.repeat(images, RESPONSES, axis=0),
        "tok": np.arange(b * 6, b * 6 + 6, dtype=np.int64).reshape(6, 1),
    }


async def main() -> None:
    address, topic, arg = sys.argv[1:4]
    start, n = (int(v) for v in arg.split(":"))
    async with Queue(topic, broker=address, dedup=["img"]) as q:
        for b in range(start, start + n):
            await q.put(batch(b), partition_id="p")
            print(f"ACK {b}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
