"""Conformance suite for storage backends: every rule of the contract in ``persisting.queue.backend``.

Subclass ``BackendContract`` in a test module (the class name must start with ``Test`` so pytest collects it)::

    from persisting.testing.backend_contract import BackendContract

    class TestMyBackend(BackendContract):
        backend_class = MyBackend   # or override make_backend(self, bucket_id, storage_path, **kwargs)
        durable = True              # False: flush() does not survive a new backend object (declare it too)

Everything runs on real storage in pytest's ``tmp_path``. Each test drives one backend object from one event
loop (``asyncio.run``, as the engine does), so no async pytest plugin is needed. Knobs:

``durable``
    Whether rows survive ``flush()`` + a new backend object on the same path. Must match the backend's own
    ``durable`` class attribute (``test_declares_durability``); the reopen tests are skipped when false.
``mark_non_durable_for_queue``
    For a non-durable backend that does not declare ``durable = False``: the ``Queue`` end-to-end test sets
    ``durable = False`` on each instance so the engine keeps and replays its log. Prefer declaring it.
``expected_failures``
    ``{"test_name": "why"}``: those tests are marked ``xfail(strict=True)`` for this backend (a known gap that
    must be fixed or kept documented; the mark fails the run once the test starts passing).
``timeout_seconds``
    Seconds after which one async test is cancelled, so that a backend that hangs fails instead of blocking.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ..client import Queue
from ..queue.backend import StorageBackend

Row = dict[str, Any]
Backend = Any  # whatever make_backend returns; checked against StorageBackend in test_has_the_protocol_methods

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Every value type of the contract, with the values that tend to break storage layers.
VALUE_SAMPLES: dict[str, list[Any]] = {
    "bool": [True, False],
    "int": [0, 1, -1, INT64_MAX, INT64_MIN, 2**31, -(2**31) - 1, 2**53 + 1],
    "float": [0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 5e-324, 1.7976931348623157e308],
    "str": ["", "a", "ünïcødé ✓ 漢字 🚀", "line\nbreak\ttab", "nul\x00inside", "x" * 10_000],
    "bytes": [b"", b"\x00", bytes(range(256)), b"\xff" * 10_000],
}

# Keys the contract allows that storage layers mangle: separators, quoting, escapes, reserved-looking prefixes.
AWKWARD_KEYS: list[str] = [
    "a.b",
    "a.b.c",
    ".",
    "with space",
    " lead",
    "trail ",
    "`tick`",
    "back`tick",
    "100%",
    "%2E",
    "%",
    "%%25",
    "ünï✓",
    "漢字",
    "🚀",
    "a,b",
    "a[0]",
    "a:b",
    "a/b",
    "a\\b",
    "quote'\"",
    "tab\there",
    "new\nline",
    "nul\x00key",
    "-dash",
    "1digit",
    "*",
    "UPPER",
    "upper",
]
ROW_PREFIX_KEYS: list[str] = ["_row", "_rowid", "_rowaddr", "_row_id", "_row_addr", "_rowoffset", "_rowX"]
ENGINE_KEYS: list[str] = ["_persisting_index", "_persisting_partition"]
PERSISTING_PREFIX_KEYS: list[str] = ["_persisting_", "_persisting_nulls", "_persisting_x.y", "_persisting_future"]


# -- comparison helpers ---------------------------------------------------------------------------------------


def same_value(got: Any, expected: Any) -> bool:
    """Exact equality: same type (``True`` is not ``1``), NaN equals NaN, ``-0.0`` is not ``0.0``."""
    if type(got) is not type(expected):
        return False
    if isinstance(expected, float):
        if math.isnan(expected):
            return math.isnan(got)
        return bool(got == expected and math.copysign(1.0, got) == math.copysign(1.0, expected))
    return bool(got == expected)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def row_difference(got: Mapping[str, Any], expected: Mapping[str, Any]) -> str | None:
    """Why two rows differ (None when they are the same row)."""
    if not isinstance(got, dict):
        return f"a row must be a dict, got {type(got).__qualname__}"
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    if missing or extra:
        return f"keys differ: missing {missing!r}, unexpected {extra!r}"
    for key, value in expected.items():
        if not same_value(got[key], value):
            return f"key {key!r}: got {_short(got[key])} ({type(got[key]).__qualname__}), expected {_short(value)}"
    return None


def assert_rows_equal(got: Sequence[Mapping[str, Any]], expected: Sequence[Mapping[str, Any]], what: str = "") -> None:
    """Same number of rows, in the same order, each with the same keys and exactly the same values."""
    where = f" ({what})" if what else ""
    assert isinstance(got, list), f"expected a list of rows{where}, got {type(got).__qualname__}"
    assert len(got) == len(expected), f"expected {len(expected)} rows{where}, got {len(got)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        why = row_difference(g, e)
        assert why is None, f"row {i}{where}: {why}"


async def collect(stream: AsyncIterator[list[Row]]) -> list[list[Row]]:
    """Every batch a ``get_stream`` yields; each must be a list."""
    batches: list[list[Row]] = []
    try:
        async for batch in stream:
            assert isinstance(batch, list), f"get_stream must yield lists of rows, got {type(batch).__qualname__}"
            batches.append(batch)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
    return batches


def flat(batches: list[list[Row]]) -> list[Row]:
    return [row for batch in batches for row in batch]


def async_test(
    fn: Callable[..., Coroutine[Any, Any, None]],
) -> Callable[..., None]:
    """Run an ``async def test_...(self, ...)`` with ``asyncio.run``, cancelled after ``self.timeout_seconds``."""

    @functools.wraps(fn)
    def wrapper(self: BackendContract, *args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(self, *args, **kwargs), self.timeout_seconds))

    return wrapper


def typed_rows(n: int, start: int = 0) -> list[Row]:
    """Rows using every value type, with explicit None and absent keys mixed in."""
    rows: list[Row] = []
    for i in range(start, start + n):
        row: Row = {"i": i, "s": f"row {i} ✓", "f": i / 7, "flag": i % 2 == 0, "blob": i.to_bytes(4, "big")}
        if i % 3 == 0:
            row["maybe"] = None
        elif i % 3 == 1:
            row["maybe"] = -i
        if i % 5 == 0:
            del row["s"]
        rows.append(row)
    return rows


# -- hypothesis strategies ------------------------------------------------------------------------------------

VALUE_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "bool": st.booleans(),
    "int": st.integers(min_value=INT64_MIN, max_value=INT64_MAX),
    "float": st.floats(allow_nan=True, allow_infinity=True),  # includes -0.0 and subnormals
    "str": st.text(max_size=24),  # valid Unicode only: the engine refuses lone surrogates before a backend
    "bytes": st.binary(max_size=24),
}
KEY_STRATEGY: st.SearchStrategy[str] = st.one_of(
    st.sampled_from(AWKWARD_KEYS + ROW_PREFIX_KEYS + ENGINE_KEYS),
    st.text(min_size=1, max_size=10),
)


@st.composite
def row_batches(draw: st.DrawFn) -> tuple[list[list[Row]], list[str], list[bool]]:
    """Batches of rows over a random schema (one type per key), each key absent, None or a value per row."""
    schema = draw(st.dictionaries(KEY_STRATEGY, st.sampled_from(sorted(VALUE_STRATEGIES)), min_size=1, max_size=6))
    keys = list(schema)
    n_batches = draw(st.integers(min_value=1, max_value=5))
    batches: list[list[Row]] = []
    for _ in range(n_batches):
        batch: list[Row] = []
        for _ in range(draw(st.integers(min_value=1, max_value=8))):
            row: Row = {}
            for key in keys:
                choice = draw(st.sampled_from(("absent", "none", "value", "value")))
                if choice == "none":
                    row[key] = None
                elif choice == "value":
                    row[key] = draw(VALUE_STRATEGIES[schema[key]])
            batch.append(row)
        batches.append(batch)
    how = [draw(st.sampled_from(("put", "put_batch"))) for _ in batches]
    flushes = [draw(st.booleans()) for _ in batches]
    return batches, how, flushes


# -- the suite ------------------------------------------------------------------------------------------------


class BackendContract:
    """Conformance tests for one storage backend. Subclass with a ``Test`` name and set ``backend_class``."""

    backend_class: ClassVar[Callable[..., Any] | None] = None
    durable: ClassVar[bool] = True
    mark_non_durable_for_queue: ClassVar[bool] = False
    expected_failures: ClassVar[Mapping[str, str]] = {}
    timeout_seconds: ClassVar[float] = 60.0

    # -- hooks ----------------------------------------------------------------------------------------------

    def make_backend(self, bucket_id: int, storage_path: str, **kwargs: Any) -> Backend:
        """One backend object; override to pass options. ``kwargs`` holds ``batch_size`` and test extras."""
        factory = type(self).backend_class  # through the class: a plain function stays unbound
        if factory is None:
            raise NotImplementedError(
                f"{type(self).__qualname__} must set backend_class = YourBackend or override make_backend()"
            )
        return factory(bucket_id, storage_path, **kwargs)

    def queue_backend_factory(self) -> Callable[..., Any]:
        """What the Queue end-to-end test passes as ``Queue(..., backend=...)``: ``make_backend`` as a factory."""
        suite = self

        def contract_backend(bucket_id: int, storage_path: str, batch_size: int = 100, **kwargs: Any) -> Backend:
            backend = suite.make_backend(bucket_id, storage_path, batch_size=batch_size, **kwargs)
            if suite.mark_non_durable_for_queue:
                backend.durable = False
            return backend

        return contract_backend

    @pytest.fixture(autouse=True)
    def _apply_expected_failures(self, request: pytest.FixtureRequest) -> None:
        name = getattr(request.node, "originalname", None) or request.node.name
        reason = self.expected_failures.get(name)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))

    def _new(self, path: Path, bucket_id: int = 0, batch_size: int = 100, **kwargs: Any) -> Backend:
        return self.make_backend(bucket_id, str(path), batch_size=batch_size, **kwargs)

    def _require_durable(self) -> None:
        if not self.durable:
            pytest.skip("backend is not durable (durable = False): nothing survives a new backend object")

    async def _put_all(self, backend: Backend, rows: list[Row], chunk: int = 0) -> None:
        """put_batch in chunks (0: one put per row)."""
        if chunk <= 0:
            for row in rows:
                await backend.put(row)
            return
        for start in range(0, len(rows), chunk):
            await backend.put_batch(rows[start : start + chunk])

    # -- construction ---------------------------------------------------------------------------------------

    def test_expected_failures_name_tests_of_the_suite(self) -> None:
        unknown = [name for name in self.expected_failures if not callable(getattr(self, name, None))]
        assert not unknown, f"expected_failures names tests that do not exist: {unknown}"

    def test_has_the_protocol_methods(self, tmp_path: Path) -> None:
        backend = self._new(tmp_path)
        assert isinstance(backend, StorageBackend), (
            f"{type(backend).__qualname__} lacks methods of persisting.queue.backend.StorageBackend"
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


__all__ = [
    "AWKWARD_KEYS",
    "ENGINE_KEYS",
    "PERSISTING_PREFIX_KEYS",
    "ROW_PREFIX_KEYS",
    "VALUE_SAMPLES",
    "BackendContract",
    "assert_rows_equal",
    "async_test",
    "collect",
    "row_batches",
    "same_value",
]
