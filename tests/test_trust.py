"""Nothing a client says can pin arena space for others: the broker names processes from the kernel (the ipc
socket's peer credentials), and bounds what one living process may pin (broker/peers.py, broker/extents.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import Queue
from persisting.client.connection import connection

from .broker_fixture import BrokerProcess

WORKER = Path(__file__).with_name("raw_peer_worker.py")
ARENA_BYTES = 4 * 1024 * 1024
BATCH = np.ones((8, 16 * 1024), np.float32)  # 512 KiB
pytestmark = pytest.mark.slow


async def _arena(address: str) -> dict[str, Any]:
    stats: dict[str, Any] = (await connection(address).request("hello", {})).result["arena_stats"]
    return stats


def test_a_client_naming_pid_1_and_never_releasing_cannot_stop_other_puts(arena_broker: BrokerProcess) -> None:
    async def go() -> None:
        async with Queue("trust", broker=arena_broker.address) as q:
            for _ in range(3):  # 1.5 MiB of samples for the bad client to hold views of
                await q.put({"x": BATCH}, partition_id="p")
            await q.flush()
        bad = subprocess.Popen(
            [sys.executable, str(WORKER), arena_broker.address, "trust", "0", "24"], stdout=subprocess.PIPE
        )
        try:
            assert bad.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(bad.stdout.readline), 60)
            got = json.loads(line)
            print("the bad client got", got)
            assert got["held"] and got["last"] == "Full"  # it holds views and was refused leases at some point
            async with Queue("trust", broker=arena_broker.address) as q:
                for i in range(24):  # 12 MiB through a 4 MiB arena, part of it pinned by the bad client
                    await q.put({"x": BATCH * i}, partition_id="q", timeout=10)
            stats = await _arena(arena_broker.address)
            assert stats["most_pinned_by_one_process"] <= stats["max_pinned_bytes_per_process"]
        finally:
            bad.kill()
            bad.wait()
        # Its leases and holds were its own (the kernel's pid, not pid 1): they go with it.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = await _arena(arena_broker.address)
            if stats["holds"] == 0 and stats["leased_bytes"] == 0:
                break
            await asyncio.sleep(0.2)
        assert stats["holds"] == 0 and stats["leased_bytes"] == 0, stats

    asyncio.run(go())


def test_a_connection_without_peer_credentials_gets_no_arena(tmp_path: Path) -> None:
    """Over tcp the kernel names no process: the broker shows that client no arena (tensors travel as copies, and
    it cannot lease or hold arena space), and the data is the same."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = BrokerProcess(tmp_path / "data", f"tcp://127.0.0.1:{port}", extra_args=["--arena-bytes", str(ARENA_BYTES)])
    try:
        b.start()

        async def go() -> None:
            hello = (await connection(b.address).request("hello", {})).result
            assert hello["arena"] == {} and hello["arena_stats"]["size_bytes"] > 0
            async with Queue("tcp", broker=b.address) as q:
                await q.put({"x": BATCH}, partition_id="p")
                data = await q.get_data(await q.get_meta(["x"], 8, "t", "p"))
                np.testing.assert_array_equal(data["x"], BATCH)
                moved = (await q.stats())["zerocopy"]
                assert moved["get_zero_copy_bytes"] == 0 and moved["put_zero_copy_bytes"] == 0
            stats = await _arena(b.address)
            assert stats["holds"] == 0 and stats["leased_bytes"] == 0

        asyncio.run(go())
        assert b.stop() == 0
    finally:
        b.ensure_dead()


def test_what_each_process_pins_is_counted_through_every_transition() -> None:
    """The bound's bookkeeping (broker/extents.py) against a recount from scratch, over random leases, seals,
    holds, releases, abandons, flushes and evictions by several processes; seed printed."""
    import random

    from broker.extents import Extents

    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    peers = [(10**7 + i, i) for i in range(3)]  # not running processes: reap() is not called here

    def recount(ex: Extents, peer: tuple[int, int]) -> int:
        mine = {e.id: e.nbytes for e in ex.extents.values() if not e.sealed and e.owner == peer}
        mine.update({e.id: e.nbytes for e in ex.extents.values() if peer in e.holds.values()})
        return sum(mine.values())

    async def main() -> None:
        ex = Extents(64 * 1024 * 1024, max_pinned_bytes=16 * 1024 * 1024)
        leased: list[Any] = []
        holds: list[tuple[int, tuple[int, int]]] = []
        index = 0
        for _ in range(3000):
            step, peer = rng.random(), rng.choice(peers)
            if step < 0.3:
                ext = ex.try_lease(rng.choice([4096, 65536, 1 << 20, 20 << 20]), peer)
                if ext is not None:
                    leased.append(ext)
            elif step < 0.5 and leased:
                ext = leased.pop(rng.randrange(len(leased)))
                index += 1
                ex.seal(ext, "t", index)
            elif step < 0.55 and leased:
                ex.abandon(leased.pop(rng.randrange(len(leased))))
            elif step < 0.75:
                sealed = [e.id for e in ex.extents.values() if e.sealed]
                chosen = rng.sample(sealed, min(len(sealed), rng.randint(1, 3)))
                if chosen and ex.may_hold(peer, chosen):
                    holds.append((ex.hold(chosen, peer), peer))
            elif step < 0.9 and holds:
                hold, holder = holds.pop(rng.randrange(len(holds)))
                assert ex.release(hold, holder)
            elif step < 0.97:
                ex.persisted("t", rng.randint(0, index + 1))
            else:
                ex._evict_for(1 << 20)
            for p in peers:
                pinned = ex.pinned_bytes(p)
                assert pinned == recount(ex, p), f"seed {seed}"
        for hold, holder in holds:
            ex.release(hold, holder)
        for ext in leased:
            ex.abandon(ext)
        assert all(ex.pinned_bytes(p) == 0 for p in peers), f"seed {seed}"

    asyncio.run(main())
