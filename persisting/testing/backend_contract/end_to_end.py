"""The backend driven by the real engine: Queue(..., backend=...)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ...client.queue import Queue
from ._support import (
    Row,
    assert_rows_equal,
    async_test,
)
from .durability import DurabilityRules


class EndToEndRules(DurabilityRules):
    # -- end to end through the engine ----------------------------------------------------------------------

    @async_test
    async def test_queue_end_to_end(self, tmp_path: Path) -> None:
        """``Queue(..., backend=...)`` over this backend: put, get, flush, close, reopen, get, put more."""
        factory = self.queue_backend_factory()
        records: list[Row] = []
        for i in range(60):
            record: Row = {"id": i, "text": f"t{i} ✓", "score": i / 4, "ok": i % 2 == 0, "raw": bytes([i % 256])}
            if i % 4 == 0:
                record["maybe"] = None
            elif i % 4 == 1:
                record["maybe"] = i
            if i >= 30:
                record["a.b `c` 100%"] = f"late key {i}"
            if i % 7 == 0:
                del record["id"]  # no bucket column: the engine spreads these by index
            records.append(record)

        def queue() -> Queue:
            # batch_size above the row count: flushes happen only where this test calls flush().
            return Queue("contract", tmp_path, backend=factory, num_buckets=3, batch_size=1000)

        q = queue()
        try:
            await q.put_batch(records[:25])
            for record in records[25:30]:
                await q.put(record)
            await q.put_batch(records[30:45])
            assert_rows_equal(await q.get(100, 0), records[:45], "Queue.get before flush")
            await q.flush()
            assert_rows_equal(await q.get(100, 0), records[:45], "Queue.get after flush")
            assert_rows_equal(await q.get(10, 20), records[20:30], "Queue.get window")
            await q.put_batch(records[45:])
            await q.flush()
            stats = await q.stats()
            assert stats["total_count"] == 60
        finally:
            await q.aclose()
        # Reopen: a durable backend reads its flushed rows back; for durable = False the engine replays its log.
        q = queue()
        try:
            assert_rows_equal(await q.get(100, 0), records, "Queue.get after reopen")
            more: list[Row] = [{"id": 1000 + i, "text": "after reopen"} for i in range(10)]
            await q.put_batch(more)
            streamed = [r async for batch in q.stream(limit=70) for r in batch]
            assert_rows_equal(streamed, records + more, "Queue.stream after reopen")
            await q.flush()
        finally:
            await q.aclose()
        q = queue()
        try:
            assert_rows_equal(await q.get(100, 0), records + more, "Queue.get after a second reopen")
        finally:
            await q.aclose()

    @async_test
    async def test_queue_reads_while_it_flushes(self, tmp_path: Path) -> None:
        """Queue.get and Queue.stream during background and explicit flushes return exactly the rows asked for."""
        factory = self.queue_backend_factory()
        records: list[Row] = [{"id": i, "v": f"value {i}", "half": i / 2} for i in range(600)]
        q = Queue("contract-busy", tmp_path, backend=factory, num_buckets=2, batch_size=20)
        finished = False
        checked = 0

        async def writer() -> None:
            nonlocal finished
            try:
                for n, start in enumerate(range(0, len(records), 25)):
                    await q.put_batch(records[start : start + 25])
                    if n % 3 == 0:
                        await q.flush()
                await q.flush()
            finally:
                finished = True

        async def reader() -> None:
            nonlocal checked
            back = 0
            while not finished:
                n = len(q)
                back = back % 90 + 7
                offset = max(0, n - back)  # windows near the end: rows a flush may be moving right now
                limit = min(5, n - offset)
                got = await q.get(limit, offset)
                assert_rows_equal(got, records[offset : offset + limit], f"Queue.get({limit}, {offset}) mid-flush")
                checked += 1
                await asyncio.sleep(0)

        async def streamer() -> None:
            got = [r async for batch in q.stream(limit=len(records), wait=True, timeout=10) for r in batch]
            assert_rows_equal(got, records, "Queue.stream(wait=True) during flushes")

        try:
            await asyncio.gather(writer(), reader(), streamer())
            assert checked > 0
            assert_rows_equal(await q.get(1000, 0), records, "Queue.get after the writer")
        finally:
            await q.aclose()
