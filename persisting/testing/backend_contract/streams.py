"""get_stream: limits, waiting, timeouts, wake-up."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ._support import (
    Backend,
    assert_rows_equal,
    async_test,
    collect,
    flat,
    typed_rows,
)
from .rows import RowRules


class StreamRules(RowRules):
    # -- get_stream -----------------------------------------------------------------------------------------

    @async_test
    async def test_get_stream_yields_lists_in_order(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=64)
        rows = typed_rows(333)
        await self._put_all(backend, rows, chunk=50)
        batches = await collect(backend.get_stream(333, 0))
        assert_rows_equal(flat(batches), rows, "get_stream(333, 0)")
        batches = await collect(backend.get_stream(10_000, 0, wait=False))
        assert_rows_equal(flat(batches), rows, "get_stream(10000, 0)")

    @async_test
    async def test_get_stream_honours_limit_and_offset(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=16)
        rows = typed_rows(250)
        await self._put_all(backend, rows, chunk=40)
        for limit, offset in [(1, 0), (7, 3), (100, 100), (101, 99), (150, 120), (1000, 249), (5, 250), (5, 400)]:
            got = flat(await collect(backend.get_stream(limit, offset)))
            assert_rows_equal(got, rows[offset : offset + limit], f"get_stream(limit={limit}, offset={offset})")
        assert flat(await collect(backend.get_stream(0, 0))) == [], "limit 0 yields nothing"

    @async_test
    async def test_get_stream_without_wait_stops_at_the_end(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        rows = typed_rows(5)
        await backend.put_batch(rows)
        t0 = time.monotonic()
        got = flat(await collect(backend.get_stream(100, 2, wait=False, timeout=30)))
        assert_rows_equal(got, rows[2:])
        assert time.monotonic() - t0 < 5, "wait=False must not wait for more rows"

    @async_test
    async def test_get_stream_wait_returns_after_the_timeout(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        timeout = 0.5
        t0 = time.monotonic()
        assert flat(await collect(backend.get_stream(10, 0, wait=True, timeout=timeout))) == []
        elapsed = time.monotonic() - t0
        assert timeout * 0.8 <= elapsed < timeout + 5, f"empty backend: returned after {elapsed:.3f}s"

        rows = typed_rows(4)
        await backend.put_batch(rows)
        t0 = time.monotonic()
        got = flat(await collect(backend.get_stream(10, 1, wait=True, timeout=timeout)))
        elapsed = time.monotonic() - t0
        assert_rows_equal(got, rows[1:], "rows present, then a wait that times out")
        assert timeout * 0.8 <= elapsed < timeout + 5, f"after the existing rows: returned after {elapsed:.3f}s"

    @async_test
    async def test_get_stream_wait_with_zero_timeout_does_not_block(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        await backend.put({"i": 0})
        t0 = time.monotonic()
        try:
            got = await asyncio.wait_for(collect(backend.get_stream(10, 0, wait=True, timeout=0)), 5)
        except TimeoutError:
            pytest.fail("get_stream(wait=True, timeout=0) was still waiting after 5 s (timeout=0 means no wait)")
        assert_rows_equal(flat(got), [{"i": 0}])
        assert time.monotonic() - t0 < 5

    @async_test
    async def test_get_stream_wait_ends_at_the_limit_without_waiting(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        rows = typed_rows(5)
        await backend.put_batch(rows)
        t0 = time.monotonic()
        got = flat(await collect(backend.get_stream(3, 1, wait=True, timeout=20)))
        assert_rows_equal(got, rows[1:4])
        assert time.monotonic() - t0 < 5, "the limit was reached: the stream must end, not wait"

    async def _wake_up(self, backend: Backend, timeout: float | None) -> None:
        await backend.put({"i": 0})

        async def producer() -> None:
            await asyncio.sleep(0.2)
            await backend.put({"i": 1})
            await asyncio.sleep(0.2)
            await backend.put_batch([{"i": 2}, {"i": 3, "x": "late"}])

        task = asyncio.create_task(producer())
        t0 = time.monotonic()
        got = flat(await collect(backend.get_stream(4, 0, wait=True, timeout=timeout)))
        elapsed = time.monotonic() - t0
        await task
        assert_rows_equal(got, [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3, "x": "late"}], "streamed while put")
        assert elapsed < 5, f"the stream took {elapsed:.2f}s: a put must wake a waiting get_stream"

    @async_test
    async def test_get_stream_wait_wakes_up_on_put(self, tmp_path: Path) -> None:
        await self._wake_up(self._new(tmp_path, batch_size=2), timeout=20)

    @async_test
    async def test_get_stream_wait_without_timeout_wakes_up_on_put(self, tmp_path: Path) -> None:
        await self._wake_up(self._new(tmp_path, batch_size=2), timeout=None)

    @async_test
    async def test_get_stream_timeout_is_per_wait(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        timeout, gap = 1.0, 0.4

        async def producer() -> None:
            for i in range(4):
                await asyncio.sleep(gap)
                await backend.put({"i": i})

        task = asyncio.create_task(producer())
        t0 = time.monotonic()
        got = flat(await collect(backend.get_stream(4, 0, wait=True, timeout=timeout)))
        elapsed = time.monotonic() - t0
        await task
        assert_rows_equal(got, [{"i": i} for i in range(4)], f"rows {gap}s apart with timeout={timeout}s")
        assert elapsed > timeout, "the stream as a whole may outlive one timeout"
