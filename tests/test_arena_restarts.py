"""A broker killed and restarted between a reply that names its arena and the client's mapping of that arena.

Found by test_purge's kill -9 test (seed 2797819804, get_batch handed out wrong values): a client maps the
broker's arena again when a reply names a generation it has not mapped yet (the first one after a restart). If
that broker dies before the client asks for the arena's file, the client got the next broker's arena, of the same
size at the same path, and used the old reply's offsets in it: a consumer read another batch's bytes as its own,
and a producer wrote its batch over a batch the new broker had acknowledged.

Each test drives that interleaving exactly: the broker is SIGKILLed and restarted at the moment the client is
about to map the arena a reply named, and another batch is put into the new arena at once, where the old reply's
offsets point. Everything else is real (the broker subprocess, its arena in shared memory, the kill).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from persisting import Queue
from persisting.client.remote_tensors import ArenaClient

from .broker_fixture import BrokerProcess

ARENA_BYTES = 4 * 1024 * 1024
pytestmark = pytest.mark.slow

DECOY = -1  # the value every sample of the batch put into the new arena holds


def _restart_before_mapping(
    monkeypatch: pytest.MonkeyPatch, broker: BrokerProcess, decoy: Callable[[], Awaitable[Any]]
) -> list[bytes]:
    """Once armed (the returned list's first append), the next time a client is about to map an arena generation
    it has not mapped, the broker dies (SIGKILL), a new one starts and ``decoy`` puts a batch into its arena;
    then the client goes on. Returns the list: [armed marker, generation the client was about to map]."""
    real = ArenaClient._arena
    fired: list[bytes] = []

    async def arena(self: ArenaClient, generation: bytes | None = None) -> Any:
        cached = (self._arena_info or {}).get("generation")
        if fired == [b"armed"] and generation is not None and cached != generation:
            fired.append(generation)
            await asyncio.to_thread(broker.stop, signal.SIGKILL)
            await asyncio.to_thread(broker.start)
            await decoy()
        return await real(self, generation)

    monkeypatch.setattr(ArenaClient, "_arena", arena)
    return fired


def test_get_batch_whose_broker_dies_before_its_views_are_made_reads_its_own_batch(
    arena_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer's get_batch was answered (views into the arena) by a broker that dies before the consumer
    maps that arena: it gets the batch it took, with its own values, from the broker that restarted (which
    answers a take sent again with its key with the same samples), never the bytes another batch left there."""

    async def go() -> None:
        async with Queue("t", broker=arena_broker.address) as producer, Queue("t", broker=arena_broker.address) as q:

            async def decoy() -> None:
                async with Queue("t", broker=arena_broker.address) as other:
                    await other.put({"x": np.full(8, DECOY, np.int64)}, partition_id="decoy")

            fired = _restart_before_mapping(monkeypatch, arena_broker, decoy)
            arena_broker.stop(signal.SIGKILL)
            arena_broker.start()  # the consumer has not seen this broker's arena yet
            meta = await producer.put({"x": np.arange(8, dtype=np.int64)}, partition_id="p")
            fired.append(b"armed")
            data, taken = await q.get_batch(["x"], 8, "train", "p")
            assert len(fired) == 2, "the broker was not restarted between the reply and the mapping"
            assert taken.global_indexes == meta.global_indexes
            assert data["x"].tolist() == list(range(8)), "get_batch read another batch's bytes"
            # The take was not handed out twice: the task has nothing more in "p".
            _, again = await q.get_batch(["x"], 8, "train", "p")
            assert again.size == 0

    asyncio.run(go())


def test_get_data_whose_broker_dies_before_its_views_are_made_reads_its_samples(
    arena_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        async with Queue("t", broker=arena_broker.address) as producer, Queue("t", broker=arena_broker.address) as q:

            async def decoy() -> None:
                async with Queue("t", broker=arena_broker.address) as other:
                    await other.put({"x": np.full(8, DECOY, np.int64)}, partition_id="decoy")

            fired = _restart_before_mapping(monkeypatch, arena_broker, decoy)
            arena_broker.stop(signal.SIGKILL)
            arena_broker.start()
            await producer.put({"x": np.arange(8, dtype=np.int64)}, partition_id="p")
            meta = await q.get_meta(["x"], 8, "train", "p")
            fired.append(b"armed")
            data = await q.get_data(meta)
            assert len(fired) == 2, "the broker was not restarted between the reply and the mapping"
            assert data["x"].tolist() == list(range(8)), "get_data read another batch's bytes"

    asyncio.run(go())


def test_a_put_whose_lease_came_from_a_broker_that_died_never_writes_into_the_next_arena(
    arena_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer leased an extent from a broker that dies before the producer maps that broker's arena: it
    must not copy its batch to that extent's offset in the next broker's arena, where an acknowledged batch of
    another producer lies; it leases afresh from the new broker. Both batches keep their values."""

    async def go() -> None:
        decoy_meta: list[Any] = []
        async with Queue("t", broker=arena_broker.address) as producer:

            async def decoy() -> None:
                async with Queue("t", broker=arena_broker.address) as other:
                    decoy_meta.append(await other.put({"x": np.full(8, DECOY, np.int64)}, partition_id="decoy"))

            fired = _restart_before_mapping(monkeypatch, arena_broker, decoy)
            await producer.put({"x": np.zeros(8, np.int64)}, partition_id="before")  # maps the first arena
            arena_broker.stop(signal.SIGKILL)
            arena_broker.start()  # the producer has not seen this broker's arena yet
            fired.append(b"armed")
            meta = await producer.put({"x": np.arange(8, dtype=np.int64)}, partition_id="p")
            assert len(fired) == 2, "the broker was not restarted between the lease and the mapping"
        async with Queue("t", broker=arena_broker.address) as q:
            for want, part, stored in ((DECOY, "decoy", decoy_meta[0]), (None, "p", meta)):
                got = await q.get_meta(["x"], 8, "check", part)
                assert got.global_indexes == stored.global_indexes
                values = (await q.get_data(got))["x"].tolist()
                assert values == ([want] * 8 if want is not None else list(range(8))), f"partition {part!r}: {values}"
            await q.flush()  # and what reaches Lance: read back by a broker that has the arena no more
        arena_broker.stop(signal.SIGKILL)
        arena_broker.start()
        async with Queue("t", broker=arena_broker.address) as q:
            got = await q.get_meta(["x"], 8, "after", "decoy")
            assert (await q.get_data(got))["x"].tolist() == [DECOY] * 8

    asyncio.run(go())
