"""Construction, ordering, reads, value types and keys."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ...storage.backend import StorageBackend
from ._base import ContractBase
from ._support import (
    AWKWARD_KEYS,
    ENGINE_KEYS,
    PERSISTING_PREFIX_KEYS,
    ROW_PREFIX_KEYS,
    VALUE_SAMPLES,
    Backend,
    Row,
    assert_rows_equal,
    async_test,
    collect,
    flat,
    typed_rows,
)


class RowRules(ContractBase):
    # -- construction ---------------------------------------------------------------------------------------

    def test_expected_failures_name_tests_of_the_suite(self) -> None:
        unknown = [name for name in self.expected_failures if not callable(getattr(self, name, None))]
        assert not unknown, f"expected_failures names tests that do not exist: {unknown}"

    def test_has_the_protocol_methods(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        assert isinstance(backend, StorageBackend), (
            f"{type(backend).__qualname__} lacks methods of persisting.storage.backend.StorageBackend"
        )
        for name in ("put", "put_batch", "get", "flush", "stats"):
            assert asyncio.iscoroutinefunction(getattr(backend, name)), f"{name} must be an async method"
        assert not asyncio.iscoroutinefunction(backend.total_count), "total_count must be a plain method"

    def test_constructor_accepts_unknown_kwargs(self, tmp_path: Path) -> None:
        backend = self.make_backend(0, str(tmp_path), batch_size=10, option_from_the_future=1, another={"x": 1})
        assert backend.total_count() == 0
        asyncio.run(self._roundtrip_one(backend))

    def test_constructor_default_batch_size_and_keywords(self, tmp_path: Path) -> None:
        backend = self.make_backend(bucket_id=2, storage_path=str(tmp_path))
        assert backend.total_count() == 0
        asyncio.run(self._roundtrip_one(backend))

    async def _roundtrip_one(self, backend: Backend) -> None:
        await backend.put({"k": 1})
        assert_rows_equal(await backend.get(10, 0), [{"k": 1}])

    def test_declares_durability(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        declared = getattr(backend, "durable", True)
        assert declared == self.durable, (
            f"the suite was told durable={self.durable}, the backend declares durable={declared!r} "
            "(a backend whose flush does not survive a new object must set the class attribute durable = False; "
            "the engine reads it to keep its write-ahead log)"
        )

    @async_test
    async def test_empty_backend(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        assert backend.total_count() == 0
        assert_rows_equal(await backend.get(10, 0), [], "get on an empty backend")
        assert_rows_equal(await backend.get(10, 5), [], "get past the end of an empty backend")
        assert flat(await collect(backend.get_stream(10, 0))) == []
        await backend.flush()  # flushing nothing is harmless
        await backend.flush()
        assert backend.total_count() == 0

    # -- ordering and reads ---------------------------------------------------------------------------------

    @async_test
    async def test_put_then_get_in_order(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=4)  # small batches: a backend that buffers stores several
        rows = typed_rows(23)
        await self._put_all(backend, rows)
        assert backend.total_count() == 23
        assert_rows_equal(await backend.get(23, 0), rows, "all rows")
        for offset, limit in [(0, 1), (3, 5), (4, 4), (7, 10), (22, 1), (1, 21)]:
            assert_rows_equal(await backend.get(limit, offset), rows[offset : offset + limit], f"[{offset}:+{limit}]")

    @async_test
    async def test_put_batch_then_get_in_order(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=10)
        rows = typed_rows(157)
        await backend.put_batch(rows[:1])
        await backend.put_batch(rows[1:40])
        await backend.put(rows[40])
        await backend.flush()
        await backend.put_batch(rows[41:100])
        await backend.flush()
        await backend.put_batch(rows[100:157])  # partly flushed by batch_size, partly buffered
        assert backend.total_count() == 157
        assert_rows_equal(await backend.get(1000, 0), rows, "all rows")
        for offset, limit in [(0, 41), (35, 10), (40, 1), (95, 10), (99, 3), (150, 7), (156, 1)]:
            assert_rows_equal(await backend.get(limit, offset), rows[offset : offset + limit], f"[{offset}:+{limit}]")

    @async_test
    async def test_get_offsets_and_limits_beyond_the_end(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=4)
        rows = typed_rows(10)
        await backend.put_batch(rows[:6])
        await backend.flush()
        await backend.put_batch(rows[6:])  # some stored, some possibly buffered
        cases = [(5, 8), (100, 8), (100, 0), (1, 9), (1, 10), (1, 11), (5, 1000), (0, 5), (0, 10), (0, 11)]
        for limit, offset in cases:
            assert_rows_equal(
                await backend.get(limit, offset), rows[offset : offset + limit], f"get(limit={limit}, offset={offset})"
            )
        assert backend.total_count() == 10

    @async_test
    async def test_every_window_over_flushed_and_unflushed_rows(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        rows = typed_rows(19)
        await backend.put_batch(rows[:11])
        await backend.flush()
        await backend.put_batch(rows[11:])  # 11 flushed rows, then 8 that may still be buffered
        for offset in range(22):
            for limit in range(22):
                want = rows[offset : offset + limit]
                assert_rows_equal(await backend.get(limit, offset), want, f"get(limit={limit}, offset={offset})")

    @async_test
    async def test_none_is_kept_and_absent_stays_absent(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        rows: list[Row] = [
            {"a": 1, "b": None},
            {"a": None},
            {"b": "x"},
            {},
            {"a": None, "b": None, "only_none": None},
            {"a": 2},
        ]
        await backend.put_batch(rows[:3])
        await backend.flush()
        await backend.put_batch(rows[3:])
        assert_rows_equal(await backend.get(10, 0), rows, "before the last flush")
        await backend.flush()
        assert_rows_equal(await backend.get(10, 0), rows, "after flush")

    @async_test
    async def test_new_keys_appear_later(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        rows: list[Row] = [{"a": 1}, {"a": 2}]
        await backend.put_batch(rows)
        await backend.flush()
        later: list[Row] = [
            {"a": 3, "b": "new"},  # new key after a flush
            {"b": "only b"},
            {"c": None},  # a key seen first as None...
        ]
        await backend.put_batch(later)
        assert_rows_equal(await backend.get(10, 0), rows + later, "new keys, unflushed")
        await backend.flush()
        last: list[Row] = [{"c": 1.5, "d": b"\x01"}, {"a": 4}]  # ...then with a value; d new in a new flush
        await backend.put_batch(last)
        await backend.put({"e": True})
        expected = [*rows, *later, *last, {"e": True}]
        assert_rows_equal(await backend.get(10, 0), expected, "new keys across flushes")
        await backend.flush()
        assert_rows_equal(await backend.get(10, 0), expected, "after the final flush")

    @async_test
    async def test_all_value_types_round_trip(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        rows: list[Row] = []
        for kind, values in VALUE_SAMPLES.items():
            for value in values:
                rows.append({kind: value, "kind": kind})
            rows.append({kind: None, "kind": kind})
        half = len(rows) // 2
        await backend.put_batch(rows[:half])
        await backend.flush()
        await backend.put_batch(rows[half:])
        assert_rows_equal(await backend.get(len(rows), 0), rows, "stored and buffered")
        await backend.flush()
        assert_rows_equal(await backend.get(len(rows), 0), rows, "after flush")
        wide: Row = {kind: values[0] for kind, values in VALUE_SAMPLES.items()}  # every type in one row
        await backend.put(wide)
        await backend.flush()
        assert_rows_equal(await backend.get(1, len(rows)), [wide], "one row with every type")

    async def _check_keys(self, tmp_path: Path, keys: list[str]) -> None:
        backend = self._new(tmp_path, batch_size=1000)
        rows: list[Row] = []
        for n, key in enumerate(keys):
            rows.append({key: f"value of {key}", "n": n})
            rows.append({key: None, "n": n})
            rows.append({"n": n})
        rows.append({key: f"all {i}" for i, key in enumerate(keys)} | {"n": -1})
        await backend.put_batch(rows[: len(rows) // 2])
        await backend.flush()
        await backend.put_batch(rows[len(rows) // 2 :])
        assert_rows_equal(await backend.get(len(rows), 0), rows, "stored and buffered")
        await backend.flush()
        assert_rows_equal(await backend.get(len(rows), 0), rows, "after flush")
        if self.durable:
            again = self._new(tmp_path)
            assert_rows_equal(await again.get(len(rows), 0), rows, "new backend object")

    @async_test
    async def test_awkward_keys(self, tmp_path: Path) -> None:
        await self._check_keys(tmp_path, AWKWARD_KEYS)

    @async_test
    async def test_keys_starting_with_row(self, tmp_path: Path) -> None:
        await self._check_keys(tmp_path, ROW_PREFIX_KEYS)

    @async_test
    async def test_engine_keys(self, tmp_path: Path) -> None:
        await self._check_keys(tmp_path, ENGINE_KEYS)

    @async_test
    async def test_any_key_with_the_engine_prefix(self, tmp_path: Path) -> None:
        """The contract gives the ``_persisting_`` prefix to the engine: a backend must not claim such keys."""
        await self._check_keys(tmp_path, PERSISTING_PREFIX_KEYS)

    @async_test
    async def test_total_count_counts_unflushed_rows(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path, batch_size=10_000)
        await backend.put({"i": 0})
        assert backend.total_count() == 1
        await backend.put_batch([{"i": i} for i in range(1, 50)])
        assert backend.total_count() == 50
        stats = await backend.stats()
        assert stats["total_count"] == 50
        await backend.flush()
        assert backend.total_count() == 50
        await backend.put_batch([{"i": i} for i in range(50, 60)])
        assert backend.total_count() == 60
