"""Several requests in flight on one client connection (pipelined) through a real broker: every one is answered,
puts keep the order they were sent in, and reads in flight at once each get their own window."""

from __future__ import annotations

import asyncio

from persisting import Queue

from .broker_fixture import BrokerProcess

BATCHES = 40
PER_BATCH = 25


async def _pipelined(address: str) -> None:
    q = Queue("pipelined", broker=address, durability="process")
    await q.open()
    try:
        batches = [[{"b": b, "i": i} for i in range(PER_BATCH)] for b in range(BATCHES)]
        ranges = await asyncio.gather(*(q.put_batch(batch) for batch in batches))  # all sent before any reply
        assert [r.start for r in ranges] == [b * PER_BATCH for b in range(BATCHES)]  # the order they were sent in
        pages = await asyncio.gather(*(q.get(limit=PER_BATCH, offset=b * PER_BATCH) for b in range(BATCHES)))
        assert pages == batches
        waiting = asyncio.ensure_future(q.get(limit=1, offset=BATCHES * PER_BATCH))  # nothing there: empty
        assert await waiting == []
    finally:
        await q.aclose()


def test_pipelined_requests_on_one_connection(broker: BrokerProcess) -> None:
    asyncio.run(_pipelined(broker.address))
