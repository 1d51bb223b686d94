"""The lifecycle of arena holds and mappings on the client side: a hold goes back to the broker when its views
die (also when the event loop that made them has ended, and at ``aclose()``), a release never reaches a later
broker's hold, and a client that lives through broker restarts keeps mapped only what it still uses."""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import Queue
from persisting.client.connection import connection
from persisting.tensors.arena import default_path

from .broker_fixture import BrokerProcess

ARENA_BYTES = 1024 * 1024
pytestmark = pytest.mark.slow


async def _arena(address: str) -> dict[str, Any]:
    stats: dict[str, Any] = (await connection(address).request("hello", {})).result["arena_stats"]
    return stats


def _holds_now(address: str) -> int:
    return int(asyncio.run(_arena(address))["holds"])


def _mapped_arena_files(broker: BrokerProcess) -> set[str]:
    """The files of this broker's arena (by inode: one per broker generation) that this process has mapped;
    each pins its shared memory while mapped, unlinked or not."""
    path = str(default_path(broker.storage))
    out = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5] == path:
            out.add(parts[4])
    return out


def test_a_loop_per_step_leaks_no_hold(arena_broker: BrokerProcess) -> None:
    """200 ``asyncio.run()`` steps, each a put and a get_data whose views die as the step's loop ends: the
    broker's holds stay flat and a small arena never fills (before: one hold leaked per step, then Full)."""
    batch = np.ones((4, 16 * 1024), np.float32)  # 256 KiB: a quarter of the arena

    async def step(i: int) -> float:
        async with Queue("steps", broker=arena_broker.address) as q:
            await q.put({"x": batch * i}, partition_id="p", timeout=5)
            meta = await q.get_meta(["x"], 4, "train", "p")
            data = await q.get_data(meta)
            return float(data["x"][0, 0])  # the views die with this coroutine, after aclose()

    most = 0
    for i in range(200):
        assert asyncio.run(step(i)) == i
        if i % 20 == 19:
            most = max(most, _holds_now(arena_broker.address))
    assert most <= 1, f"{most} holds stayed in the broker"
    deadline = time.monotonic() + 5
    while _holds_now(arena_broker.address) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _holds_now(arena_broker.address) == 0


def test_aclose_sends_the_releases_still_pending(arena_broker: BrokerProcess) -> None:
    async def go() -> None:
        q = await Queue("close", broker=arena_broker.address).open()
        await q.put({"x": np.ones((2, 1024), np.float32)}, partition_id="p")
        data = await q.get_data(await q.get_meta(["x"], 2, "t", "p"))
        assert (await _arena(arena_broker.address))["holds"] == 1
        del data
        gc.collect()
        await q.aclose()  # right away: no timer of this loop has run since the views died

    asyncio.run(go())
    assert _holds_now(arena_broker.address) == 0


def test_a_release_from_before_a_restart_never_frees_a_later_hold(arena_broker: BrokerProcess) -> None:
    """Hold ids start again at 1 in a restarted broker: a view of the old broker that dies must not release the
    hold with the same number that the same process got from the new one (its views would then be reused)."""

    async def go() -> None:
        async with Queue("gen", broker=arena_broker.address) as q:
            await q.put({"x": np.ones((2, 1024), np.float32)}, partition_id="p")
            old = await q.get_data(await q.get_meta(["x"], 2, "a", "p"))
            arena_broker.kill()
            arena_broker.start()
            await q.put({"x": np.ones((2, 1024), np.float32)}, partition_id="p2")  # in the new arena
            new = await q.get_data(await q.get_meta(["x"], 2, "a", "p2"))
            assert (await _arena(arena_broker.address))["holds"] == 1
            del old
            gc.collect()
            await asyncio.sleep(0.3)
            await q.get_meta(["x"], 2, "other", "p")  # a request that carries pending releases
            assert (await _arena(arena_broker.address))["holds"] == 1, "the old broker's hold freed the new one"
            assert float(new["x"].sum()) == 2 * 1024

    asyncio.run(go())


def test_a_client_living_through_restarts_keeps_no_old_arena_mapped(arena_broker: BrokerProcess) -> None:
    """10 broker restarts (SIGKILL and clean, alternating) under one live client that puts and reads each time:
    its holds in the broker and the arena files it has mapped stay flat (before: one more arena each restart)."""

    async def go() -> None:
        async with Queue("live", broker=arena_broker.address) as q:
            for round_no in range(10):
                await q.put({"x": np.full((2, 4096), round_no, np.float32)}, partition_id="p", timeout=10)
                data = await q.get_data(await q.get_meta(["x"], 2, "t", "p"))
                assert float(data["x"][0, 0]) == round_no
                del data
                gc.collect()
                arena_broker.stop(signal.SIGKILL if round_no % 2 == 0 else signal.SIGTERM)
                arena_broker.start()
                await q.put({"y": np.zeros((1, 8), np.float32)}, partition_id="q", timeout=10)  # maps the new arena
                mapped = _mapped_arena_files(arena_broker)
                assert len(mapped) == 1, f"round {round_no}: arena files mapped: {mapped}"
                assert (await _arena(arena_broker.address))["holds"] == 0

    asyncio.run(go())
