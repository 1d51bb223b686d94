"""Arena batches are written behind: flushed once the topic is quiet, once the oldest has waited long enough, on
``flush()``, or when the arena fills; not while a stream of puts goes on. A real broker subprocess each time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import Queue
from persisting.client.connection import connection

from .broker_fixture import BrokerProcess, make_broker

pytestmark = pytest.mark.slow


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    started: list[BrokerProcess] = []

    def start(idle_s: float, max_s: float, step_bytes: int = 128 * 1024 * 1024) -> BrokerProcess:
        monkeypatch.setenv("PERSISTING_WRITE_BEHIND_IDLE", str(idle_s))
        monkeypatch.setenv("PERSISTING_WRITE_BEHIND_MAX", str(max_s))
        monkeypatch.setenv("PERSISTING_WRITE_BEHIND_STEP_BYTES", str(step_bytes))
        b = make_broker(tmp_path)
        b.extra_args = ["--arena-bytes", str(64 * 1024 * 1024)]
        b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        if b.proc is not None and b.proc.poll() is None:
            assert b.stop() == 0
        b.ensure_dead()


async def _unpersisted(address: str) -> int:
    return int((await connection(address).request("hello", {})).result["arena_stats"]["unpersisted_bytes"])


def _batch(i: int) -> dict[str, np.ndarray]:
    return {"x": np.full((16, 256), i, np.float32)}


def test_a_quiet_topic_is_flushed_soon_after_its_last_arena_put(make: Any) -> None:
    broker = make(0.05, 60)

    async def go() -> None:
        async with Queue("t", broker=broker.address) as q:
            await q.put(_batch(1), partition_id="p")
            assert await _unpersisted(broker.address) > 0
            deadline = time.monotonic() + 10
            while await _unpersisted(broker.address) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert await _unpersisted(broker.address) == 0, "the idle flush did not come"

    asyncio.run(go())


def test_a_stream_of_arena_puts_is_not_flushed_until_asked(make: Any) -> None:
    broker = make(60, 60)

    async def go() -> None:
        async with Queue("t", broker=broker.address) as q:
            for i in range(8):  # far more than batch_size (100) rows: records would have been flushed by now
                await q.put(_batch(i), partition_id="p")
            await asyncio.sleep(1.0)
            assert await _unpersisted(broker.address) == 8 * 16 * 256 * 4
            assert not list((broker.storage / "t").glob("bucket-*.lance")), "flushed while it should wait"
            await q.flush()
            assert await _unpersisted(broker.address) == 0
            meta = await q.get_meta(["x"], 200, "train", "p")
            assert len(meta) == 128

    asyncio.run(go())


def test_the_oldest_arena_batch_is_flushed_after_the_longest_wait_even_under_a_stream(make: Any) -> None:
    broker = make(60, 0.5)

    async def go() -> None:
        async with Queue("t", broker=broker.address) as q:
            flushed_during_stream = False
            t0 = time.monotonic()
            i = 0
            while time.monotonic() - t0 < 3.0:
                await q.put(_batch(i), partition_id="p")
                i += 1
                await asyncio.sleep(0.02)
                if time.monotonic() - t0 > 1.5 and list((broker.storage / "t").glob("bucket-*.lance")):
                    flushed_during_stream = True
            assert flushed_during_stream, "no flush within 3 s of steady puts although the longest wait is 0.5 s"

    asyncio.run(go())


def _commits(storage: Path) -> int:
    """Lance versions over every bucket of topic t: one per commit (each flush writes each bucket once)."""
    import lance

    return sum(lance.dataset(str(b)).version for b in (storage / "t").glob("bucket-*.lance"))


@pytest.mark.parametrize("step_bytes", [1, 1 << 30])
def test_a_quiet_topic_is_written_in_steps_of_bounded_payload(make: Any, step_bytes: int) -> None:
    """Steps of one batch: a commit per batch; one big step: one flush, a commit per bucket (4 buckets)."""
    broker = make(0.2, 60, step_bytes)

    async def go() -> None:
        async with Queue("t", broker=broker.address) as q:
            for i in range(8):
                await q.put(_batch(i), partition_id="p")
            deadline = time.monotonic() + 20
            while await _unpersisted(broker.address) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert await _unpersisted(broker.address) == 0
            commits = _commits(broker.storage)
            assert commits == 8 if step_bytes == 1 else commits <= 4, commits

    asyncio.run(go())
