"""Exact round trips, schema evolution and conflicts, and bad input that leaves the queue usable."""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persisting import InvalidRecordError, PersistingError, Queue, SchemaConflictError, SyncQueue
from persisting.engine.config import TopicConfig
from persisting.engine.topic import Topic
from persisting.storage import LanceBackend
from persisting.wire import codec, row_checks


def roundtrip(store: Path, records: list[dict[str, Any]], *, flush: bool, name: str = "rt") -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        async with Queue(name, storage_path=store) as q:
            await q.put_batch(records)
            if flush:
                await q.flush()
            return await q.get(limit=len(records) + 10)

    return asyncio.run(main())


def assert_same(a: Any, b: Any) -> None:
    """Equality that also checks types, numpy dtype/shape and NaN."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and (a == b or (a != a and b != b))
    else:
        assert a == b


RICH = [
    {
        "id": 1,
        "b": True,
        "i": -(2**63),
        "f": -0.0,
        "s": "ünïcode ✓",
        "raw": b"\x00\xff",
        "none": None,
        "nested": {"a": [1, 2.5, None, "x", b"y", (1, 2)], "k": {"deep": [True, {"z": []}]}, 7: "int key"},
        "tup": (1, (2, 3), []),
        "arr": np.arange(12, dtype=np.float32).reshape(3, 4),
        "arr0": np.array(5, dtype=np.int16),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 3), dtype=np.uint8),
        "nonc": np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2],
        "structured": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
    },
    {"id": 2, "f": float("nan"), "i": 2**63 - 1, "s": "", "raw": b""},
    {"id": 3},
    {"id": 4, "f": float("inf"), "b": False, "none": 5},
]


@pytest.mark.parametrize("flush", [False, True], ids=["buffered", "flushed"])
def test_exact_round_trip(store: Path, flush: bool) -> None:
    got = roundtrip(store, RICH, flush=flush)
    expected = [dict(r) for r in RICH]
    expected[0]["nonc"] = np.ascontiguousarray(expected[0]["nonc"])
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_same(g, e)


def test_round_trip_survives_reopen(store: Path) -> None:
    roundtrip(store, RICH, flush=False, name="reopen")  # closed: flushes
    got = roundtrip(store, [], flush=False, name="reopen")
    assert len(got) == len(RICH)
    assert_same(got[3], RICH[3])


def test_absent_key_stays_absent_and_no_internal_columns_leak(store: Path) -> None:
    got = roundtrip(store, [{"id": 1, "a": 1}, {"id": 2, "b": None}, {"id": 3}], flush=True)
    assert got == [{"id": 1, "a": 1}, {"id": 2, "b": None}, {"id": 3}]
    assert "b" in got[1] and "a" not in got[1]


def test_returned_arrays_are_owned_copies(store: Path) -> None:
    got = roundtrip(store, [{"id": 1, "a": np.arange(3)}], flush=True)
    got[0]["a"] += 1  # writable
    assert got[0]["a"].tolist() == [1, 2, 3]


def test_new_keys_add_columns_across_flushes(store: Path) -> None:
    async def main() -> None:
        async with Queue("evolve", storage_path=store, num_buckets=2) as q:
            await q.put_batch([{"id": i, "a": i} for i in range(10)])
            await q.flush()
            await q.put_batch([{"id": i, "b": str(i)} for i in range(10, 20)])
            await q.flush()
            await q.put_batch([{"id": i, "a": i, "b": "x", "c": [i]} for i in range(20, 30)])
            await q.flush()
            rows = await q.get(100)
            assert rows[0] == {"id": 0, "a": 0} and rows[10] == {"id": 10, "b": "10"}
            assert rows[25] == {"id": 25, "a": 25, "b": "x", "c": [25]}
        async with Queue("evolve", storage_path=store, num_buckets=2) as q:
            assert (await q.get(1, 29)) == [{"id": 29, "a": 29, "b": "x", "c": [29]}]

    asyncio.run(main())


def test_type_conflict_is_refused_at_put_time_and_names_field(store: Path) -> None:
    async def main() -> None:
        async with Queue("conflict", storage_path=store) as q:
            await q.put({"id": 1, "score": 0.5})
            with pytest.raises(SchemaConflictError, match=r"'score' is stored as float.*gives int"):
                await q.put({"id": 2, "score": 1})
            await q.flush()
            with pytest.raises(SchemaConflictError, match="'id' is stored as int"):
                await q.put({"id": "three"})
            # within one batch
            with pytest.raises(SchemaConflictError, match="'new'"):
                await q.put_batch([{"id": 4, "new": 1}, {"id": 5, "new": "x"}])
            # nothing of the refused batch was stored, nothing is stuck, the queue goes on
            assert len(q) == 1
            await q.put({"id": 6, "score": 2.0, "new": "ok"})
            await q.flush()
            assert [r["id"] for r in await q.get()] == [1, 6]
            assert (await q.stats())["buffered"] == 0
        async with Queue("conflict", storage_path=store) as q:  # the kinds persist
            with pytest.raises(SchemaConflictError, match="'new' is stored as str"):
                await q.put({"id": 7, "new": 7})

    asyncio.run(main())


def test_the_engine_checks_kinds_again_whenever_they_or_the_schema_change(store: Path) -> None:
    """The engine checks a producer's kinds once per schema (puts.Appender): a put encoded against a stale view of
    the schema (another producer added the field, as through a broker) or with another kind of a field it put
    before is still refused, and a put of a new field still lands in the schema and across a reopen."""

    async def put(topic: Topic, record: dict[str, Any]) -> None:
        batch = codec.encode_batch([record], {})  # the engine's schema unseen, as a remote producer's may be
        await topic.append(batch, "p", codec.pack(batch.rows))

    async def go() -> None:
        topic = Topic("kinds", store, TopicConfig(durability="process"), LanceBackend)
        await topic.open()
        try:
            for i in range(3):
                await put(topic, {"a": i})
            with pytest.raises(SchemaConflictError, match="'a' is stored as int"):
                await put(topic, {"a": "three"})  # the same field names as the puts before, another kind
            await put(topic, {"a": 4, "b": "x"})  # the schema grows
            with pytest.raises(SchemaConflictError, match="'b' is stored as str"):
                await put(topic, {"b": 5})
            await put(topic, {"a": 6})
            assert topic.kinds == {"a": "int", "b": "str"}
            assert topic.count() == 5
        finally:
            await topic.close()
        topic = Topic("kinds", store, TopicConfig(durability="process"), LanceBackend)
        await topic.open()
        try:
            assert (topic.kinds, topic.count()) == ({"a": "int", "b": "str"}, 5)
            with pytest.raises(SchemaConflictError, match="'a' is stored as int"):
                await put(topic, {"a": "again"})
        finally:
            await topic.close()

    asyncio.run(go())


def test_kind_of_field_introduced_by_a_buffered_put_is_enforced(store: Path) -> None:
    async def main() -> None:
        async with Queue("kinds", storage_path=store, batch_size=10**6) as q:
            await q.put({"id": 1, "v": [1]})
            with pytest.raises(SchemaConflictError):
                await q.put({"id": 2, "v": b"bytes"})

    asyncio.run(main())


class Opaque:
    pass


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"id": 1, "s": {1, 2}}, "'s' holds a value of type set"),
        ({"id": 1, "o": Opaque()}, "'o' holds a value of type Opaque"),
        ({"id": 1, "n": [1, {2, 3}]}, "'n' contains a value of type set"),
        ({1: "x"}, "key of type int"),
        ({("a",): "x"}, "key of type tuple"),
        ({"": 1}, "non-empty"),
        ({"_persisting_index": 1}, "reserved"),
        ({"id": 2**64}, "outside the 64-bit range"),
        ({"id": 1, "n": [2**70]}, "'n' cannot be encoded"),
        ({"id": 1, "a": np.array([object()], dtype=object)}, "dtype object"),
        ({"id": 1, "d": {(1, 2): 3}}, "dict key of type tuple"),
        ({"id": 1, "s": "bad \ud800 surrogate"}, "not valid UTF-8"),
    ],
)
def test_bad_records_get_clear_errors_and_queue_stays_usable(store: Path, record: Any, match: str) -> None:
    with SyncQueue("bad", storage_path=store) as q:
        q.put({"id": 0})
        with pytest.raises(InvalidRecordError, match=match) as info:
            q.put(record)
        assert isinstance(info.value, PersistingError) and isinstance(info.value, TypeError)
        with pytest.raises(InvalidRecordError):
            q.put_batch([{"id": 5}, record])  # the good record before it is not stored either
        q.put({"id": 9})
        q.flush()
        assert [r["id"] for r in q.get()] == [0, 9]


@pytest.mark.parametrize("bad", [{"id": 1}, "text", 5, None, [1, 2]])
def test_put_batch_needs_a_list_of_dicts(store: Path, bad: Any) -> None:
    with SyncQueue("pb", storage_path=store) as q, pytest.raises(InvalidRecordError):
        q.put_batch(bad)
    with SyncQueue("pb", storage_path=store) as q, pytest.raises(InvalidRecordError):
        q.put([{"id": 1}])  # type: ignore[arg-type]


def test_torch_tensor_in_a_record_round_trips_as_torch(store: Path) -> None:
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 2).to(torch.bfloat16)
    with SyncQueue("t", storage_path=store) as q:
        q.put({"id": 1, "t": t})
        with pytest.raises(InvalidRecordError, match="'t'"):
            q.put({"id": 2, "t": t.float().numpy()})  # numpy where the field holds torch
        got = q.get()[0]["t"]
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and torch.equal(got, t)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=20),
    st.binary(max_size=20),
)
nested = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=5), children, max_size=3),
    ),
    max_leaves=10,
)
keys = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=8).filter(
    lambda k: not k.startswith("_persisting_")
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.dictionaries(keys, nested, max_size=5), min_size=1, max_size=8))
def test_property_round_trip_of_nested_values(
    tmp_path_factory: pytest.TempPathFactory, records: list[dict[str, Any]]
) -> None:
    # One field keeps one kind: wrap every value so each field is "nested" (the property is about values).
    wrapped = [{k: [v] for k, v in r.items()} for r in records]
    store = tmp_path_factory.mktemp("prop")
    got = roundtrip(store, wrapped, flush=True)
    assert len(got) == len(wrapped)
    for g, e in zip(got, wrapped, strict=True):
        assert_same(g, e)


# -- rows that arrive from outside (the broker checks them before storing) -------------------------------


def _rows(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    batch = codec.encode_batch(records, {})
    return batch.rows, batch.kinds


def test_check_rows_accepts_what_encode_batch_produces() -> None:
    records: list[dict[str, Any]] = [
        {"i": 2**63 - 1, "f": 1.5, "s": "x", "b": b"y", "t": True, "n": [1, (2,)], "a": np.arange(3)},
        {"i": None, "maybe": None},
        {"maybe": None, "s": None},
        {},
        {"i": -(2**63)},
    ]
    rows, kinds = _rows(records)
    assert row_checks.check_rows(rows, kinds, len(rows)) is rows


@pytest.mark.parametrize(
    ("rows", "kinds", "match"),
    [
        ("not a list", {}, "expected a list of 1 rows"),
        ([{"a": 1}, {"a": 2}], {"a": "int"}, "expected a list of 1 rows"),
        ([{"a": 1}], {"a": "complex"}, "unknown kind 'complex' for field 'a'"),
        ([{"a": 1}], {"a": ["int"]}, "unknown kind"),
        ([[1]], {}, "row 0 is not a map"),
        ([{"": 1}], {"": "int"}, "row 0 has an invalid key ''"),
        ([{"_persisting_index": None}], {}, "row 0 has an invalid key '_persisting_index'"),
        ([{"_persisting_index": 1}], {"_persisting_index": "int"}, "invalid key '_persisting_index'"),
        ([{b"a": 1}], {}, "row 0 has an invalid key b'a'"),
        ([{"a": "1"}], {"a": "int"}, "row 0: field 'a' holds str, its declared kind is 'int'"),
        ([{"a": True}], {"a": "int"}, "field 'a' holds bool, its declared kind is 'int'"),
        ([{"a": 1}], {}, "field 'a' holds int, its declared kind is None"),
        ([{"a": 2**63}], {"a": "int"}, "row 0: field 'a' is outside the 64-bit range"),
        ([{"a": [1]}], {"a": "nested"}, "field 'a' holds list, its declared kind is 'nested'"),
    ],
)
def test_check_rows_refuses_what_encode_batch_never_produces(rows: Any, kinds: Any, match: str) -> None:
    with pytest.raises(InvalidRecordError, match=re.escape(match)):
        row_checks.check_rows(rows, kinds, 1 if not isinstance(rows, list) else min(len(rows), 1))


def test_check_rows_checks_each_batch_against_its_own_kinds() -> None:
    # The storage types of the last kinds are kept (row_checks._Expected): other kinds, or the same kinds after a
    # batch whose None-only field took the slow path, are checked as if seen first.
    assert row_checks.check_rows([{"a": 1, "m": None}], {"a": "int"}, 1)
    with pytest.raises(InvalidRecordError, match=re.escape("field 'm' holds int, its declared kind is None")):
        row_checks.check_rows([{"a": 1, "m": 5}], {"a": "int"}, 1)
    with pytest.raises(InvalidRecordError, match=re.escape("field 'a' holds int, its declared kind is 'str'")):
        row_checks.check_rows([{"a": 1}], {"a": "str"}, 1)
    assert row_checks.check_rows([{"a": "s"}], {"a": "str"}, 1)
    with pytest.raises(InvalidRecordError, match=re.escape("field 'a' holds str, its declared kind is 'int'")):
        row_checks.check_rows([{"a": "s"}], {"a": "int"}, 1)


def test_check_rows_names_the_first_bad_row() -> None:
    rows, kinds = _rows([{"a": i, "b": None} for i in range(10)])
    rows[7]["b"] = 1  # "b" held only None before, so it has no kind
    rows[8]["a"] = "late"
    with pytest.raises(InvalidRecordError, match=re.escape("row 7: field 'b' holds int, its declared kind is None")):
        row_checks.check_rows(rows, kinds, 10)
    rows[7]["b"] = None
    with pytest.raises(InvalidRecordError, match=re.escape("row 8: field 'a' holds str")):
        row_checks.check_rows(rows, kinds, 10)


def test_check_rows_of_empty_rows_still_checks_kinds_and_the_rest() -> None:
    # Tensor-only puts send one empty row per sample: accepted without a per-row loop, but the kinds are still
    # checked, and one row that is not empty among them gets the per-row check.
    empty: list[dict[str, Any]] = [{} for _ in range(256)]
    assert row_checks.check_rows(empty, {"x": "int"}, 256) is empty
    with pytest.raises(InvalidRecordError, match=re.escape("unknown kind 'complex' for field 'x'")):
        row_checks.check_rows(empty, {"x": "complex"}, 256)
    with pytest.raises(InvalidRecordError, match=re.escape("row 5 has an invalid key ''")):
        row_checks.check_rows([*empty[:5], {"": 1}, *empty[6:]], {}, 256)
    with pytest.raises(InvalidRecordError, match=re.escape("row 3 is not a map")):
        row_checks.check_rows([*empty[:3], [], *empty[4:]], {}, 256)
