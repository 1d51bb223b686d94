"""Durability, concurrency, stats, optional methods and the property test."""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ._support import (
    VALUE_SAMPLES,
    Row,
    assert_rows_equal,
    async_test,
    collect,
    flat,
    row_batches,
    typed_rows,
)
from .streams import StreamRules


class DurabilityRules(StreamRules):
    # -- durability -----------------------------------------------------------------------------------------

    @async_test
    async def test_flush_then_a_new_backend_object_reads_everything(self, tmp_path: Path) -> None:
        self._require_durable()
        backend = self._new(tmp_path, batch_size=1000)
        rows = typed_rows(120)
        values: list[Row] = [{kind: v} for kind, vs in VALUE_SAMPLES.items() for v in vs]
        await backend.put_batch(rows[:60])
        await backend.flush()
        await backend.put_batch(rows[60:] + values)
        await backend.flush()
        expected = rows + values
        again = self._new(tmp_path, batch_size=1000)
        assert again.total_count() == len(expected)
        assert_rows_equal(await again.get(len(expected), 0), expected, "new backend object")
        assert_rows_equal(flat(await collect(again.get_stream(len(expected), 0))), expected, "its get_stream")
        # The new object continues the positions and its own flushes survive too.
        more = typed_rows(7, start=1000)
        await again.put_batch(more)
        await again.flush()
        third = self._new(tmp_path)
        assert third.total_count() == len(expected) + 7
        assert_rows_equal(await third.get(10_000, 0), expected + more, "third backend object")

    @async_test
    async def test_flushed_none_only_keys_survive(self, tmp_path: Path) -> None:
        self._require_durable()
        backend = self._new(tmp_path, batch_size=1000)
        rows: list[Row] = [{"never_set": None, "a": 1}, {"a": None}, {}]
        await backend.put_batch(rows)
        await backend.flush()
        again = self._new(tmp_path, batch_size=1000)
        assert_rows_equal(await again.get(10, 0), rows, "reopened")
        later: list[Row] = [{"never_set": "now set", "a": 2}]
        await again.put_batch(later)
        await again.flush()
        third = self._new(tmp_path)
        assert_rows_equal(await third.get(10, 0), rows + later, "key given a value after a reopen")

    # -- concurrency ----------------------------------------------------------------------------------------

    @async_test
    async def test_get_during_flush(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=10_000)
        rows = typed_rows(200)
        await backend.put_batch(rows[:100])
        await backend.flush()
        await backend.put_batch(rows[100:150])
        flush = asyncio.create_task(backend.flush())
        await asyncio.sleep(0)  # the flush is now under way
        assert_rows_equal(await backend.get(200, 0), rows[:150], "get while flush runs")
        assert_rows_equal(await backend.get(30, 90), rows[90:120], "window across stored and flushing rows")
        more = asyncio.create_task(backend.put_batch(rows[150:]))
        assert_rows_equal((await backend.get(200, 0))[:150], rows[:150], "get while put_batch and flush run")
        await flush
        await more
        await backend.flush()
        assert_rows_equal(await backend.get(200, 0), rows, "after both")

    @async_test
    async def test_get_while_put_batch_and_flush_run(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=7)
        rows = typed_rows(400)
        acked = 0  # rows whose put_batch has returned
        finished = False

        async def writer() -> None:
            nonlocal acked, finished
            try:
                for n, start in enumerate(range(0, len(rows), 25)):
                    await backend.put_batch(rows[start : start + 25])
                    acked = start + 25
                    if n % 2:
                        await backend.flush()
                    await asyncio.sleep(0)  # let readers in even if nothing above suspends
                await backend.flush()
            finally:
                finished = True

        reads = 0

        async def reader(seed: int) -> None:
            nonlocal reads
            rng = random.Random(seed)
            while not finished:
                n = acked
                if n:
                    offset = rng.randrange(n)
                    limit = rng.randint(1, 60)
                    got = await backend.get(limit, offset)
                    must = min(limit, n - offset)  # rows already acknowledged must be there
                    assert len(got) >= must, f"get({limit}, {offset}) returned {len(got)} rows, {must} were put"
                    assert_rows_equal(got, rows[offset : offset + len(got)], f"get({limit}, {offset}) during writes")
                    reads += 1
                await asyncio.sleep(0)

        await asyncio.gather(writer(), reader(1), reader(2), reader(3))
        assert reads > 0
        assert backend.total_count() == len(rows)
        assert_rows_equal(await backend.get(len(rows), 0), rows, "after the writer")

    # -- stats, buckets, storage layout ---------------------------------------------------------------------

    @async_test
    async def test_stats(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, bucket_id=5, batch_size=1000)
        stats = await backend.stats()
        assert isinstance(stats, dict)
        assert stats["bucket_id"] == 5
        assert stats["total_count"] == 0
        await backend.put_batch(typed_rows(12))
        stats = await backend.stats()
        assert stats["bucket_id"] == 5 and stats["total_count"] == 12 == backend.total_count()
        await backend.flush()
        assert (await backend.stats())["total_count"] == 12

    @async_test
    async def test_two_buckets_in_one_storage_path(self, tmp_path: Path) -> None:
        sentinel = tmp_path / "not-a-bucket.txt"
        sentinel.write_text("leave me alone")
        before = set(os.listdir(tmp_path))
        a = self._new(tmp_path, bucket_id=0, batch_size=5)
        b = self._new(tmp_path, bucket_id=3, batch_size=5)
        rows_a = [{"i": i, "who": "a"} for i in range(30)]
        rows_b = [{"i": -i, "who": "b", "only_b": b"\x00" * i} for i in range(17)]
        for i in range(30):
            await a.put(rows_a[i])
            if i < 17:
                await b.put_batch([rows_b[i]])
            if i % 10 == 9:
                await a.flush()
        await a.flush()
        await b.flush()
        assert a.total_count() == 30 and b.total_count() == 17
        assert_rows_equal(await a.get(100, 0), rows_a, "bucket 0")
        assert_rows_equal(await b.get(100, 0), rows_b, "bucket 3")
        assert (await a.stats())["bucket_id"] == 0 and (await b.stats())["bucket_id"] == 3
        created = set(os.listdir(tmp_path)) - before
        strays = [e for e in created if not (e.startswith("bucket-0") or e.startswith("bucket-3"))]
        assert not strays, f"a backend may create only bucket-<bucket_id>... entries, found {strays}"
        assert sentinel.read_text() == "leave me alone"
        if self.durable:
            assert_rows_equal(await self._new(tmp_path, bucket_id=0).get(100, 0), rows_a, "bucket 0 reopened")
            assert_rows_equal(await self._new(tmp_path, bucket_id=3).get(100, 0), rows_b, "bucket 3 reopened")
            assert self._new(tmp_path, bucket_id=1).total_count() == 0, "an unused bucket id starts empty"

    # -- optional methods -----------------------------------------------------------------------------------

    @async_test
    async def test_optional_read_column(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        if getattr(backend, "read_column", None) is None:
            pytest.skip("backend has no read_column")
        rows: list[Row] = [{"_persisting_index": i * 3, "x": i} for i in range(20)]
        rows[4]["_persisting_index"] = None
        del rows[7]["_persisting_index"]
        await backend.put_batch(rows[:10])
        await backend.flush()
        await backend.put_batch(rows[10:])
        expected = [r.get("_persisting_index") for r in rows]
        assert await backend.read_column("_persisting_index") == expected
        assert await backend.read_column("x") == list(range(20))
        assert await backend.read_column("no such column") == [None] * 20
        assert_rows_equal(await backend.get(100, 0), rows, "rows after read_column")

    @async_test
    async def test_optional_maintain_keeps_rows(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        maintain = getattr(backend, "maintain", None)
        if maintain is None:
            pytest.skip("backend has no maintain")
        rows = typed_rows(60)
        for start in range(0, 60, 6):
            await backend.put_batch(rows[start : start + 6])
            await backend.flush()
            await maintain()
        await maintain()
        assert backend.total_count() == 60
        assert_rows_equal(await backend.get(100, 0), rows, "after maintain")
        if self.durable:
            assert_rows_equal(await self._new(tmp_path).get(100, 0), rows, "reopened after maintain")

    @async_test
    async def test_optional_aclose(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        if getattr(backend, "aclose", None) is None:
            pytest.skip("backend has no aclose")
        rows = typed_rows(10)
        await backend.put_batch(rows)
        await backend.flush()
        await backend.aclose()
        if self.durable:
            assert_rows_equal(await self._new(tmp_path).get(100, 0), rows, "reopened after aclose")

    # -- property test --------------------------------------------------------------------------------------

    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    )
    @given(data=row_batches(), batch_size=st.sampled_from([1, 3, 1000]))
    @example(  # always tried: a window inside flushed rows while later rows are still unflushed
        data=(
            [[{"n": i, "s": "x"} for i in range(8)], [{"n": i} for i in range(8, 12)], [{"s": None} for _ in range(3)]],
            ["put", "put_batch", "put"],
            [False, True, False],
        ),
        batch_size=1000,
    )
    def test_random_rows_round_trip(self, data: tuple[list[list[Row]], list[str], list[bool]], batch_size: int) -> None:
        batches, how, flushes = data
        with tempfile.TemporaryDirectory(prefix="persisting-contract-") as folder:
            asyncio.run(asyncio.wait_for(self._round_trip(Path(folder), batches, how, flushes, batch_size), 60))

    async def _round_trip(
        self, path: Path, batches: list[list[Row]], how: list[str], flushes: list[bool], batch_size: int
    ) -> None:
        backend = self._new(path, batch_size=batch_size)
        expected: list[Row] = []
        maintain = getattr(backend, "maintain", None)
        for batch, method, flush in zip(batches, how, flushes, strict=True):
            if method == "put":
                for row in batch:
                    await backend.put(row)
            else:
                await backend.put_batch(batch)
            expected.extend(batch)
            assert backend.total_count() == len(expected)
            if flush:
                await backend.flush()
                if maintain is not None:
                    await maintain()
        assert_rows_equal(await backend.get(len(expected) + 5, 0), expected, "get all")
        mid = len(expected) // 2
        assert_rows_equal(await backend.get(3, mid), expected[mid : mid + 3], "a window")
        assert_rows_equal(flat(await collect(backend.get_stream(len(expected), 0))), expected, "get_stream")
        if self.durable:
            await backend.flush()
            again = self._new(path, batch_size=batch_size)
            assert again.total_count() == len(expected)
            assert_rows_equal(await again.get(len(expected), 0), expected, "new backend object")
