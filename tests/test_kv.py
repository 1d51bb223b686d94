"""KVInterface: updates instead of new keys, partial fields, clear, missing keys, restarts, two processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from persisting import ConfigError, KVInterface, Queue

from .broker_fixture import BrokerProcess


async def _semantics(q: Queue) -> None:
    kv = KVInterface(q)
    await kv.kv_batch_put(["a", "b", "c"], [{"v": 1, "w": "x"}, {"v": 2}, {"v": 3}], "p", tags=["t1", "t2", "t3"])
    await kv.kv_put("a", {"v": 10}, "p")  # an update: w and the tag stay
    got = await kv.kv_batch_get(["a", "b"], "p")
    assert got == [{"v": 10, "w": "x"}, {"v": 2}]
    assert await kv.kv_list("p") == [("a", "t1"), ("b", "t2"), ("c", "t3")]  # three keys, not four; a keeps its place
    await kv.kv_clear(["b"], "p")
    assert await kv.kv_batch_get(["a", "c"], "p") == [{"v": 10, "w": "x"}, {"v": 3}]  # others unchanged
    assert await kv.kv_batch_get(["b", "c", "zz"], "p") == [{"v": 3}]  # cleared and never-put keys: no entry
    with pytest.raises(KeyError, match=r"\['b', 'zz'\]"):
        await kv.kv_batch_get(["b", "c", "zz"], "p", missing="raise")
    assert await kv.kv_batch_get(["b", "c"], "p", missing="none") == [None, {"v": 3}]
    assert await kv.kv_batch_get(["b", "c"], "p", missing="skip") == [None, {"v": 3}]  # "none"'s earlier name
    with pytest.raises(ConfigError, match="missing must be one of"):
        await kv.kv_batch_get(["c"], "p", missing="ignore")
    assert await kv.kv_batch_get(["a"], "p", fields=["w"]) == [{"w": "x"}]
    assert await kv.kv_list("other") == []  # partitions are apart
    await kv.kv_put("b", {"arr": np.arange(3)}, "p", tag="again")  # a cleared key can come back, fresh
    (b,) = await kv.kv_batch_get(["b"], "p")
    assert b is not None and list(b["arr"]) == [0, 1, 2] and "v" not in b
    with pytest.raises(ConfigError, match="without the fields"):
        await kv.kv_put("d", {"kv.key": "x"}, "p")


def test_kv_embedded_and_after_a_reopen(store: Path) -> None:
    async def go() -> None:
        async with Queue("kv", store) as q:
            await _semantics(q)
        async with Queue("kv", store) as q:
            kv = KVInterface(q)
            assert await kv.kv_list("p") == [("a", "t1"), ("c", "t3"), ("b", "again")]  # b: cleared, put again
            assert (await kv.kv_batch_get(["a"], "p"))[0] == {"v": 10, "w": "x"}

    asyncio.run(go())


@pytest.mark.slow
def test_kv_through_the_broker_sees_other_clients_writes(broker: BrokerProcess) -> None:
    async def go() -> None:
        async with Queue("kv", broker=broker.address) as q1, Queue("kv", broker=broker.address) as q2:
            await _semantics(q1)
            other = KVInterface(q2)  # another client: its map catches up on every call
            assert (await other.kv_batch_get(["a"], "p"))[0] == {"v": 10, "w": "x"}
            await other.kv_put("a", {"v": 11}, "p")
            assert (await KVInterface(q1).kv_batch_get(["a"], "p"))[0] == {"v": 11, "w": "x"}

    asyncio.run(go())


@pytest.mark.slow
def test_kv_survives_kill_9_of_the_broker(broker: BrokerProcess) -> None:
    """Keys, their latest (partially updated) values, tags and clears are all there after a kill -9, and a key
    written after the restart updates the key of before (no second row for it)."""

    async def before() -> None:
        async with Queue("kvk", broker=broker.address) as q:
            await _semantics(q)
            await KVInterface(q).kv_put("c", {"w": "late"}, "p")  # partial update: v stays

    asyncio.run(before())
    broker.kill()
    broker.start()

    async def after() -> None:
        async with Queue("kvk", broker=broker.address) as q:
            kv = KVInterface(q)
            assert await kv.kv_list("p") == [("a", "t1"), ("c", "t3"), ("b", "again")]
            a, c = await kv.kv_batch_get(["a", "c"], "p")
            assert a == {"v": 10, "w": "x"} and c == {"v": 3, "w": "late"}
            (b,) = await kv.kv_batch_get(["b"], "p")
            assert b is not None and list(b["arr"]) == [0, 1, 2] and "v" not in b  # the fresh b, not the cleared
            await kv.kv_put("a", {"v": 12}, "p")
            assert (await kv.kv_batch_get(["a"], "p"))[0] == {"v": 12, "w": "x"}
            assert len(await kv.kv_list("p")) == 3

    asyncio.run(after())
