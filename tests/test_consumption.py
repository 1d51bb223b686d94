"""Consumption state survives a reopen, a kill -9 of the broker, a torn log tail, and compaction."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from persisting import ConfigError, Queue, SyncQueue
from persisting.engine import consumption
from persisting.engine.layout import topic_dirname

from .broker_fixture import BrokerProcess, make_broker


def _take_all(q: SyncQueue, task: str, size: int = 7) -> list[int]:
    got: list[int] = []
    while True:
        meta = q.get_meta(["x"], size, task, "p")
        if meta.size == 0:
            return got
        got += meta.global_indexes


def test_taken_samples_stay_taken_after_a_reopen(store: Path) -> None:
    with SyncQueue("c", store) as q:
        q.put({"x": np.arange(30)}, partition_id="p")
        first = q.get_meta(["x"], 10, "train", "p").global_indexes
        q.reset_consumption("other", "p")  # a reset of a task that took nothing is harmless
    with SyncQueue("c", store) as q:
        rest = _take_all(q, "train")
        assert first == list(range(10)) and rest == list(range(10, 30))
        assert _take_all(q, "reward") == list(range(30))  # another task: its own state
        q.reset_consumption("train", "p")
    with SyncQueue("c", store) as q:
        assert _take_all(q, "train") == list(range(30))  # the reset was kept too


def test_a_torn_consumption_log_tail_is_cut(store: Path, seed: int) -> None:
    with SyncQueue("c", store) as q:
        q.put({"x": np.arange(20)}, partition_id="p")
        q.get_meta(["x"], 5, "train", "p")
        q.get_meta(["x"], 5, "train", "p")
    path = store / topic_dirname("c") / "consumption.log"
    data = path.read_bytes()
    cut = random.Random(seed).randrange(len(data) // 2 + 1, len(data))  # inside the second frame
    path.write_bytes(data[:cut] + b"\xff" * 3)
    with SyncQueue("c", store) as q:
        assert _take_all(q, "train", 100) == list(range(5, 20))  # the first take survived, the torn one did not


def test_a_long_log_is_compacted_at_open(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumption, "COMPACT_AT_BYTES", 200)
    with SyncQueue("c", store) as q:
        q.put({"x": np.arange(50)}, partition_id="p")
        for _ in range(20):
            q.get_meta(["x"], 2, "train", "p")
    path = store / topic_dirname("c") / "consumption.log"
    before = path.stat().st_size
    with SyncQueue("c", store) as q:
        assert path.stat().st_size < before  # one snapshot frame instead of 20 takes
        assert _take_all(q, "train") == list(range(40, 50))


@pytest.fixture
def unstarted(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = make_broker(tmp_path)
    try:
        yield b
    finally:
        b.ensure_dead()


@pytest.mark.slow
def test_consumption_survives_kill_9_of_the_broker(unstarted: BrokerProcess) -> None:
    unstarted.start()

    async def before() -> list[int]:
        async with Queue("k", broker=unstarted.address, durability="process") as q:
            await q.put({"x": np.arange(40)}, partition_id="p")
            taken: list[int] = []
            for _ in range(3):
                taken += (await q.get_meta(["x"], 5, "train", "p")).global_indexes
            return taken

    taken = asyncio.run(before())
    unstarted.kill()
    unstarted.start()

    async def after() -> list[int]:
        async with Queue("k", broker=unstarted.address, durability="process") as q:
            rest: list[int] = []
            while True:
                meta = await q.get_meta(["x"], 8, "train", "p")
                if meta.size == 0:
                    return rest
                rest += meta.global_indexes

    rest = asyncio.run(after())
    assert unstarted.stop() == 0
    assert taken == list(range(15)) and rest == list(range(15, 40))  # none handed out twice, none lost


@pytest.mark.slow
def _raw_take(address: str, key: str, partition: str = "p", task: str = "train", n: int = 4) -> list[int]:
    """One take on a fresh connection, as a client re-sending it after a reconnect would send it."""
    import zmq

    from persisting.tensors.arena import peer_id
    from persisting.wire import protocol

    args = {"topic": "rk", "config": {"durability": "process"}, "partition": partition, "task": task}
    args |= {"batch_size": n, "wait": 0.0, "sampler": None, "sampler_kw": {}, "lease_seconds": None}
    args |= {"ready_fields": None, "peer": peer_id(), "release": [], "key": key}
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(protocol.encode_request(protocol.Request(1, "take", args)))
        assert sock.poll(20_000), "no answer to the take"
        reply = protocol.decode_reply(sock.recv_multipart())
        assert reply.ok, reply.error_message
        return list(reply.result[0])
    finally:
        sock.close(linger=0)


def test_a_take_re_sent_after_the_broker_died_gets_the_same_batch(
    unstarted: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker writes a take, then dies before its answer reaches the client: the client's re-sent take (same
    key) must get that batch from the restarted broker, not the next one (the first would be lost to the task);
    across a log compaction too. A new key gets the next batch."""
    unstarted.start()

    async def put() -> None:
        async with Queue("rk", broker=unstarted.address, durability="process") as q:
            await q.put({"x": np.arange(40)}, partition_id="p")

    asyncio.run(put())
    assert _raw_take(unstarted.address, "k1") == [0, 1, 2, 3]
    assert _raw_take(unstarted.address, "k1") == [0, 1, 2, 3]  # a re-send on a new connection, same broker
    unstarted.kill()
    unstarted.start()
    assert _raw_take(unstarted.address, "k1") == [0, 1, 2, 3]  # the answer the dead broker could not deliver
    assert _raw_take(unstarted.address, "k2") == [4, 5, 6, 7]
    assert unstarted.stop() == 0
    monkeypatch.setattr(consumption, "COMPACT_AT_BYTES", 0)  # every open rewrites the log as a snapshot
    with SyncQueue("rk", unstarted.storage, durability="process") as q:
        q.stats()  # opened (and the log compacted) in this process
    unstarted.start()
    assert _raw_take(unstarted.address, "k2") == [4, 5, 6, 7]  # remembered in the snapshot, not only in takes
    assert _raw_take(unstarted.address, "k3") == [8, 9, 10, 11]
    assert unstarted.stop() == 0


def test_samples_through_a_broker_without_an_arena(unstarted: BrokerProcess) -> None:
    unstarted.extra_args = ["--arena-bytes", "0"]
    unstarted.start()

    async def go() -> None:
        async with Queue("na", broker=unstarted.address) as q:
            await q.put({"x": np.arange(6).reshape(3, 2)}, partition_id="p")  # over the socket
            data = await q.get_data(await q.get_meta(["x"], 3, "t", "p"))
            assert data["x"].tolist() == [[0, 1], [2, 3], [4, 5]] and data["x"].flags.writeable
            again, meta = await q.get_batch(["x"], 3, "t2", "p")
            assert meta.global_indexes == [0, 1, 2] and again["x"].tolist() == data["x"].tolist()
            moved = (await q.stats())["zerocopy"]
            assert moved["put_zero_copy_bytes"] == 0 and moved["put_copied_bytes"] == 48

    asyncio.run(go())
    assert unstarted.stop() == 0


def test_acknowledged_delivery_redelivers_what_was_not_acknowledged(store: Path) -> None:
    async def go() -> None:
        async with Queue("ack", store) as q:
            await q.put({"x": np.arange(10)}, partition_id="p")
            first = await q.get_meta(["x"], 4, "t", "p", delivery="ack", lease_seconds=0.4)
            second = await q.get_meta(["x"], 4, "t", "p", delivery="ack", lease_seconds=30)
            assert first.global_indexes == [0, 1, 2, 3] and second.global_indexes == [4, 5, 6, 7]  # leased: not again
            await q.mark_consumed("t", first.global_indexes[:2], "p")  # 0 and 1 acknowledged, 2 and 3 not
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            # waits for a full batch of 4: 8 and 9 now, 2 and 3 once the first lease ends (no put wakes it)
            again = await q.get_meta(["x"], 4, "t", "p", wait=True, timeout=10, delivery="ack", lease_seconds=30)
            assert sorted(again.global_indexes) == [2, 3, 8, 9] and loop.time() - t0 >= 0.2
            await q.mark_consumed("t", again, "p")
            with pytest.raises(ConfigError, match="no samples with global indexes"):
                await q.mark_consumed("t", [99], "p")
        async with Queue("ack", store) as q:
            # after a reopen, acknowledged samples stay consumed; the lease of 4..7 was not kept: they come back
            rest = await q.get_meta(["x"], 10, "t", "p")
            assert rest.global_indexes == [4, 5, 6, 7]

    asyncio.run(go())


@pytest.mark.slow
def test_samples_leased_by_a_killed_consumer_come_back(unstarted: BrokerProcess) -> None:
    unstarted.start()

    async def put() -> None:
        async with Queue("lk", broker=unstarted.address) as q:
            await q.put({"x": np.arange(8)}, partition_id="p")

    asyncio.run(put())
    worker = Path(__file__).with_name("arena_worker.py")
    proc = subprocess.Popen(
        [sys.executable, str(worker), unstarted.address, "lease-samples", "lk", "3"], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.split() == ["LEASED", "0", "1", "2"]

    async def take(n: int) -> list[int]:
        async with Queue("lk", broker=unstarted.address) as q:
            return (await q.get_meta(["x"], n, "t", "p", delivery="ack")).global_indexes

    assert asyncio.run(take(8)) == [3, 4, 5, 6, 7]  # its lease holds while it lives
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert asyncio.run(take(8)) == [0, 1, 2]  # its process is gone: redelivered at once
    assert unstarted.stop() == 0
