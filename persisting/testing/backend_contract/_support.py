"""Helpers, samples and strategies shared by the contract's rule modules."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

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
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
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
