"""Several tensor puts running at once from one client, through a real broker's arena: every batch stored once
with its own values, in the order the puts started, and no extent leased ahead is lost on the way (a process
keeps at most one spare extent per put it has running; closing gives them all back)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import Queue, SyncQueue
from persisting.client.connection import connection

from .broker_fixture import BrokerProcess, running_broker

# Small, so that an extent lost per put (leased ahead, then forgotten) would exhaust what one process may pin
# (half the arena) well before the puts end: the puts would then fail with Full.
ARENA_BYTES = 4 * 1024 * 1024
ROW_VALUES = 1024  # int64 per sample: 8 KiB a sample
PUTS = 400
pytestmark = pytest.mark.slow


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running_broker(tmp_path, ["--arena-bytes", str(ARENA_BYTES)]) as b:  # stopped cleanly (exit 0) after
        yield b


def _batch(i: int, rows: int) -> dict[str, Any]:
    """Batch ``i``: every value says which batch and sample it belongs to."""
    x = np.arange(rows * ROW_VALUES, dtype=np.int64).reshape(rows, ROW_VALUES) + i * 1_000_000
    return {"x": x, "i": [i] * rows}


async def _leased(address: str) -> int:
    return int((await connection(address).request("hello", {})).result["arena_stats"]["leased_extents"])


async def _check_stored(q: Queue, sizes: list[int], first: list[int]) -> None:
    """Every batch once, in start order, with its values, read back as views of the arena."""
    total = sum(sizes)
    data, meta = await q.get_batch(["x", "i"], total, "check", "p")
    assert meta.global_indexes == list(range(total)), "a sample is missing or stored twice"
    at = 0
    for i, rows in enumerate(sizes):
        assert first[i] == at, f"put {i} was stored at {first[i]}, after a put that started later"
        assert data["i"][at : at + rows] == [i] * rows
        np.testing.assert_array_equal(data["x"][at : at + rows], _batch(i, rows)["x"])
        at += rows


def test_puts_running_at_once_store_each_batch_once_in_start_order(broker: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.randint(1, 8) for _ in range(PUTS)]  # mixed sizes: a spare too small is given back
    in_flight = rng.randint(2, 6)
    print(f"{in_flight} puts in flight")

    async def go() -> None:
        first = [-1] * PUTS
        async with Queue("c", broker=broker.address) as q:

            async def put(i: int) -> None:
                meta = await q.put(_batch(i, sizes[i]), partition_id="p", timeout=30)
                first[i] = meta.global_indexes[0]
                assert meta.global_indexes == list(range(first[i], first[i] + sizes[i]))
                await q.get_batch(["x"], sizes[i], "drain", "p")  # a consumer's views, let go at once

            running: list[asyncio.Task[None]] = []
            most_leased = 0
            for i in range(PUTS):
                running.append(asyncio.ensure_future(put(i)))
                if len(running) >= in_flight:
                    await running.pop(0)
                    most_leased = max(most_leased, await _leased(broker.address))
            await asyncio.gather(*running)
            # each running put's own extent until the broker seals it, and one spare per running put at most
            assert most_leased <= 2 * in_flight, f"{most_leased} extents leased by {in_flight} puts in flight"
            await _check_stored(q, sizes, first)
        assert await _leased(broker.address) == 0, "closing the queue gives every spare extent back"

    asyncio.run(go())


def test_puts_from_threads_of_one_sync_queue_store_each_batch_once(broker: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    threads = 4
    per_thread = PUTS // threads
    sizes = [rng.randint(1, 8) for _ in range(threads * per_thread)]
    first = [-1] * len(sizes)
    errors: list[BaseException] = []
    with SyncQueue("s", broker=broker.address) as q:

        def work(t: int) -> None:
            try:
                for k in range(per_thread):
                    i = t * per_thread + k
                    meta = q.put(_batch(i, sizes[i]), partition_id="p", timeout=30)
                    first[i] = meta.global_indexes[0]
                    assert meta.global_indexes == list(range(first[i], first[i] + sizes[i]))
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not errors, errors
        total = sum(sizes)
        data, meta = q.get_batch(["x", "i"], total, "check", "p")
        assert sorted(meta.global_indexes) == list(range(total)), "a sample is missing or stored twice"
        for i, rows in enumerate(sizes):  # each put's samples together, with its own values
            at = first[i]
            assert data["i"][at : at + rows] == [i] * rows
            np.testing.assert_array_equal(data["x"][at : at + rows], _batch(i, rows)["x"])
        # each thread's puts in the order it made them
        for t in range(threads):
            mine = first[t * per_thread : (t + 1) * per_thread]
            assert mine == sorted(mine)
    assert asyncio.run(_leased(broker.address)) == 0
