"""``give_back`` (a nack of leased samples) and ``PickSampler`` (FIFO/LIFO, by id, next after), embedded and through
a real broker subprocess: the engine side of persistqueue compatibility."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from persisting import PickSampler, Queue
from persisting.errors import ConfigError

from .broker_fixture import BrokerProcess

LEASE_S = 3600.0


def _queue(tmp_path: Path, broker: BrokerProcess | None) -> Queue:
    return Queue("gb", str(tmp_path / "data"), broker=None if broker is None else broker.address)


async def _give_back_and_pick(q: Queue) -> None:
    first = await q.put_batch([{"n": n} for n in range(6)], partition_id="p")
    assert list(first) == list(range(6))
    meta = await q.get_meta(None, 2, "t", "p", delivery="ack", lease_seconds=LEASE_S)
    assert meta.global_indexes == [0, 1]
    # A take waiting for a full batch is woken by the give-back, not by a put or a lease's end.
    waiting = asyncio.ensure_future(q.get_meta(None, 5, "t", "p", wait=True, timeout=20, delivery="ack"))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    started = time.monotonic()
    await q.give_back("t", meta, "p")
    woken = await waiting
    assert sorted(woken.global_indexes) == [0, 1, 2, 3, 4] and time.monotonic() - started < 5
    await q.give_back("t", [0, 1, 2, 3, 4, 5], "p")  # 5 is not leased: left as it is
    await q.mark_consumed("t", [5], "p")
    assert (await q.partitions())["p"]["tasks"]["t"] == {"consumed": 1, "leased": 0}
    newest = await q.get_meta(None, 2, "t", "p", PickSampler("newest"), delivery="ack", lease_seconds=LEASE_S)
    assert newest.global_indexes == [4, 3]
    by_id = await q.get_meta(None, 1, "t", "p", PickSampler(ids=[2]), delivery="ack", lease_seconds=LEASE_S)
    assert by_id.global_indexes == [2]
    assert (await q.get_meta(None, 1, "t", "p", PickSampler(ids=[3]))).global_indexes == []  # leased: not ready
    after = await q.get_meta(None, 1, "t", "p", PickSampler(after=0))
    assert after.global_indexes == [1]
    wrapped = await q.get_meta(None, 1, "t", "p", PickSampler(after=1))  # nothing ready past 1: the front again
    assert wrapped.global_indexes == [0]


async def _run(tmp_path: Path, broker: BrokerProcess | None) -> None:
    async with _queue(tmp_path, broker) as q:
        await _give_back_and_pick(q)


def test_give_back_and_pick_sampler_embedded(tmp_path: Path) -> None:
    asyncio.run(_run(tmp_path, None))


def test_give_back_and_pick_sampler_through_the_broker(tmp_path: Path, broker: BrokerProcess) -> None:
    asyncio.run(_run(tmp_path, broker))


def test_pick_sampler_refuses_bad_arguments() -> None:
    for bad in ({"order": "random"}, {"ids": [-1]}, {"after": "3"}):
        with pytest.raises(ConfigError, match="PickSampler"):
            PickSampler(**bad)  # type: ignore[arg-type]
