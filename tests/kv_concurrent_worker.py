"""A KVInterface writer process for tests/test_kv_concurrent.py (started with multiprocessing's spawn: Lance is not
fork-safe). Each writer connects to the broker, then makes its calls in step with the others (a barrier before
each, so every writer's call on a key races the others'), waits until every writer is done, then reports what its
own KVInterface reads (every process must fold the log to the same values)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from persisting import KVInterface, Queue

KEYS = [f"k{i}" for i in range(40)]
PARTITION = "p"


async def _write(kv: KVInterface, role: str, field: str, tagged: bool, rng: random.Random, start: Any) -> None:
    keys = list(KEYS)
    rng.shuffle(keys)  # every writer is given one seed: one order of keys, one size of each call
    while keys:
        size = rng.choice((1, 1, 1, 3))  # mostly kv_put-sized calls, some batches
        chunk, keys = keys[:size], keys[size:]
        start.wait()  # every writer starts each call at once: they meet on every key
        if role == "put":
            values = [{field: int(k[1:])} for k in chunk]
            tags = [f"{field}:{k}" for k in chunk] if tagged else None
            await kv.kv_batch_put(chunk, values, PARTITION, tags)
        else:
            await kv.kv_clear(chunk, PARTITION)


async def _run(address: str, topic: str, role: str, field: str, tagged: bool, seed: int, barriers: Any) -> Any:
    async with Queue(topic, broker=address) as q:
        kv = KVInterface(q)
        await kv.kv_list(PARTITION)  # connected and caught up before the start
        await _write(kv, role, field, tagged, random.Random(seed), barriers[0])
        barriers[1].wait()
        values = await kv.kv_batch_get(KEYS, PARTITION, missing="none")
        return values, await kv.kv_list(PARTITION)


def writer(
    address: str, topic: str, role: str, field: str, tagged: bool, seed: int, barriers: Any, results: Any
) -> None:
    """``role`` "put": put ``{field: i}`` on every key k<i> (tag ``"<field>:k<i>"`` if ``tagged``); "clear":
    kv_clear every key. Puts ``(field, values, listing)`` on ``results``."""
    values, listing = asyncio.run(_run(address, topic, role, field, tagged, seed, barriers))
    results.put((field, values, listing))
