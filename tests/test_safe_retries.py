"""A put that raised BrokerUnavailableError may have been stored: sent again with the key the error carries, it is
stored exactly once (a real broker subprocess stalled with SIGSTOP, and killed with SIGKILL and restarted)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import BrokerUnavailableError, ConfigError, Queue, SyncQueue
from persisting.client import connection

from .broker_fixture import BrokerProcess

ARENA_BYTES = 8 * 1024 * 1024
STALL_TIMEOUT_S = 1.5  # the client gives up on a stalled broker after this (PERSISTING_REQUEST_TIMEOUT)


@pytest.fixture
def broker_args() -> list[str]:
    return ["--arena-bytes", str(ARENA_BYTES)]


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "REQUEST_TIMEOUT_SECONDS", STALL_TIMEOUT_S)


@pytest.fixture(params=["embedded", "broker"])
def mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if request.param == "embedded":
        yield {"storage_path": tmp_path / "data"}
        return
    b: BrokerProcess = request.getfixturevalue("broker")
    yield {"broker": b.address}


def _batch(marker: int) -> dict[str, Any]:
    return {"obs": np.full((3, 4), marker, dtype=np.float32), "step": np.arange(3, dtype=np.int64)}


async def _put(q: Queue, what: str, marker: int, key: str | None = None) -> list[int]:
    """One put of ``what`` (records: put_batch of 3; record: put of 1; tensors: a 3-sample tensor batch)."""
    if what == "records":
        return list(await q.put_batch([{"m": marker, "i": i} for i in range(3)], idempotency_key=key))
    if what == "record":
        await q.put({"m": marker, "i": 0}, idempotency_key=key)
        return []
    meta = await q.put(_batch(marker), partition_id="p", idempotency_key=key)
    assert meta is not None
    return list(meta.global_indexes)


SAMPLES_PER_PUT = {"records": 3, "record": 1, "tensors": 3}


async def _copies(q: Queue, what: str, marker: int) -> float:
    """How many copies of the put of ``marker`` are stored (samples carrying it / samples per put)."""
    rows = await q.get(limit=10_000)
    if what in ("records", "record"):
        n = sum(1 for r in rows if r.get("m") == marker)
    else:
        n = sum(1 for r in rows if r.get("obs") is not None and float(np.asarray(r["obs"]).ravel()[0]) == marker)
    return n / SAMPLES_PER_PUT[what]


async def _wait_stored(q: Queue, what: str, marker: int) -> None:
    deadline = time.monotonic() + 20
    while await _copies(q, what, marker) < 1:
        assert time.monotonic() < deadline, "the stalled put was never stored after SIGCONT"
        await asyncio.sleep(0.05)


async def _failed_put(q: Queue, what: str, marker: int, b: BrokerProcess) -> str:
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)
    with pytest.raises(BrokerUnavailableError) as info:
        await _put(q, what, marker)
    key = info.value.idempotency_key
    assert isinstance(key, str) and key
    return key


@pytest.mark.parametrize("what", ["records", "record", "tensors"])
@pytest.mark.parametrize("restart", [False, True])
def test_retry_after_a_stalled_broker_stores_once(
    broker: BrokerProcess, short_timeout: None, what: str, restart: bool
) -> None:
    """SIGSTOP: the put times out; SIGCONT: the broker stores the stalled request; (restart: then kill -9 and
    start again, so the key must come back from the log); the retry with the error's key adds nothing."""
    assert broker.proc is not None

    async def main() -> None:
        # One event loop, so one connection: the stalled request stays queued in it until the broker resumes (a
        # connection closed meanwhile drops it, and then the first attempt is simply never stored).
        async with Queue("retries", broker=broker.address) as q:
            await _put(q, what, 1)  # connected, topic open, an arena extent leased ahead
            key = await _failed_put(q, what, 2, broker)
            assert broker.proc is not None
            os.kill(broker.proc.pid, signal.SIGCONT)
            await _wait_stored(q, what, 2)
            if restart:
                broker.kill()
                broker.start()
            again = await _put(q, what, 2, key)
            assert await _copies(q, what, 2) == 1
            assert await _copies(q, what, 1) == 1
            if what != "record":
                assert len(again) == 3
        if what == "tensors":
            status = await _status(broker.address)
            assert status["arena"]["leased_bytes"] == 0, status["arena"]  # the retry's own extent went back

    asyncio.run(main())


def test_retry_after_a_broker_killed_while_stalled_stores_once(broker: BrokerProcess, short_timeout: None) -> None:
    """Killed before it read the put: the retry stores it, once (or finds the copy the connection re-sent)."""
    q = Queue("retries", broker=broker.address)
    asyncio.run(_put(q, "records", 1))
    key = asyncio.run(_failed_put(q, "records", 2, broker))
    broker.kill()
    broker.start()
    # 0, or 1 if the client's connection re-sent the queued request to the new broker before it was closed
    assert asyncio.run(_copies(q, "records", 2)) in (0, 1)
    asyncio.run(_put(q, "records", 2, key))
    asyncio.run(_put(q, "records", 2, key))
    assert asyncio.run(_copies(q, "records", 2)) == 1
    asyncio.run(q.aclose())


def test_sync_twin_carries_the_key(broker: BrokerProcess, short_timeout: None) -> None:
    assert broker.proc is not None
    with SyncQueue("retries", broker=broker.address) as q:
        q.put_batch([{"m": 1}])
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(BrokerUnavailableError) as info:
                q.put_batch([{"m": 2}, {"m": 2}])
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        first = q.put_batch([{"m": 2}, {"m": 2}], idempotency_key=info.value.idempotency_key)
        assert q.put_batch([{"m": 2}, {"m": 2}], idempotency_key=info.value.idempotency_key) == first
        assert sum(1 for r in q.get(limit=100) if r["m"] == 2) == 2


@pytest.mark.parametrize("what", ["records", "record", "tensors"])
def test_same_key_same_effect_in_both_modes(mode: dict[str, Any], what: str) -> None:
    async def main() -> None:
        async with Queue("keys", **mode) as q:
            first = await _put(q, what, 7, key="step-7-rank-0")
            assert await _put(q, what, 7, key="step-7-rank-0") == first
            assert await _copies(q, what, 7) == 1
            await _put(q, what, 8)  # no key: a new put each time
            await _put(q, what, 8)
            assert await _copies(q, what, 8) == 2

    asyncio.run(main())


def test_bad_keys_are_refused_in_both_modes(mode: dict[str, Any]) -> None:
    async def main() -> None:
        async with Queue("keys", **mode) as q:
            for bad in ("", "k" * 257, 12):
                with pytest.raises(ConfigError, match="idempotency_key"):
                    await q.put_batch([{"a": 1}], idempotency_key=bad)  # type: ignore[arg-type]
            await q.put_batch([{"a": 1}], idempotency_key="k")
            with pytest.raises(ConfigError, match="a key names one put"):
                await q.put_batch([{"a": 1}, {"a": 2}], idempotency_key="k")
            assert len(await q.get()) == 1

    asyncio.run(main())


async def _status(address: str) -> dict[str, Any]:
    reply = await connection.connection(address).request("status", {})
    return dict(reply.result)


def test_a_first_tensor_put_after_a_broker_restart_maps_the_new_arena(broker: BrokerProcess) -> None:
    """Found by the chaos run: a client that learned the arena from a broker's hello but had not mapped it yet,
    and whose broker then restarted (a new arena generation at the same path), failed its next tensor put with
    StorageError ("its generation differs") instead of asking the new broker."""

    async def main() -> None:
        async with Queue("fresh", broker=broker.address) as q:  # hello: the arena's path and generation
            broker.kill()
            broker.start()
            meta = await q.put(_batch(3), partition_id="p")
            assert meta is not None and meta.size == 3
            assert await _copies(q, "tensors", 3) == 1

    asyncio.run(main())
