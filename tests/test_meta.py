"""BatchMeta operations: property tests (hypothesis) and the errors they give."""

from __future__ import annotations

import dataclasses
import pickle

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persisting import BatchMeta, ConfigError, FieldMeta, InvalidRecordError, SampleMeta

FIELDS = {
    "ids": FieldMeta("ids", "ndarray", "<i8", (16,)),
    "lp": FieldMeta("lp", "tensor", "bfloat16", (16, 2)),
    "prompt": FieldMeta("prompt", "str"),
}


@st.composite
def metas(draw: st.DrawFn, partition: str | None = None) -> BatchMeta:
    indexes = draw(st.lists(st.integers(0, 10_000), unique=True, max_size=30))
    part = partition or draw(st.sampled_from(["a", "b"]))
    names = draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, min_size=1))
    samples = []
    for i in indexes:
        tags = draw(st.dictionaries(st.sampled_from(["len", "group"]), st.integers(0, 99), max_size=2))
        samples.append(SampleMeta(i, part, {n: FIELDS[n] for n in names}, tags))
    return BatchMeta(tuple(samples), {"fields": names})


@given(metas())
def test_dict_round_trip_through_msgpack(meta: BatchMeta) -> None:
    wire = msgpack.unpackb(msgpack.packb(meta.to_dict()), strict_map_key=False)
    assert BatchMeta.from_dict(wire) == meta


@given(metas(), st.integers(1, 7))
def test_chunk_then_concat_gives_the_meta_back(meta: BatchMeta, n: int) -> None:
    parts = meta.chunk(n)
    assert len(parts) == n
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == meta.size
    assert BatchMeta.concat(parts).samples == meta.samples


@given(metas(), st.data())
def test_select_samples_picks_in_the_given_order(meta: BatchMeta, data: st.DataObject) -> None:
    positions = data.draw(st.lists(st.integers(0, max(0, meta.size - 1)), max_size=10)) if meta.size else []
    picked = meta.select_samples(positions)
    assert picked.global_indexes == [meta.global_indexes[p] for p in positions]


@given(metas(), st.data())
def test_select_fields_keeps_samples_and_only_those_fields(meta: BatchMeta, data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(FIELDS)), unique=True, min_size=1))
    if not set(names) <= set(meta.field_names) and meta.size:
        with pytest.raises(ConfigError, match="no field named"):
            meta.select_fields(names)
        return
    chosen = meta.select_fields(names)
    assert chosen.global_indexes == meta.global_indexes
    assert all(set(s.fields) == set(names) for s in chosen.samples)
    assert chosen.extra_info["fields"] == names


@settings(max_examples=50)
@given(metas(partition="a"), metas(partition="a"))
def test_union_has_each_sample_once_and_is_idempotent(a: BatchMeta, b: BatchMeta) -> None:
    u = a.union(b)
    assert len(set(u.global_indexes)) == u.size == len(set(a.global_indexes) | set(b.global_indexes))
    assert u.union(u).samples == u.samples
    assert a.union(u).samples == u.samples  # on a tag set on both sides, the later meta wins
    for s in u.samples:  # fields merged from both sides
        from_a = next((x for x in a.samples if x.global_index == s.global_index), None)
        from_b = next((x for x in b.samples if x.global_index == s.global_index), None)
        expected = {**(from_a.fields if from_a else {}), **(from_b.fields if from_b else {})}
        assert s.fields == expected


def test_custom_meta_by_global_index() -> None:
    meta = BatchMeta(tuple(SampleMeta(i, "p", dict(FIELDS)) for i in (5, 6, 7)))
    tagged = meta.with_custom_meta({6: {"group": 1}, 7: {"group": 2}})
    assert tagged.custom_meta == [{}, {"group": 1}, {"group": 2}]
    assert meta.custom_meta == [{}, {}, {}]  # metas are immutable
    with pytest.raises(ConfigError, match=r"\[9\]"):
        meta.with_custom_meta({9: {"x": 1}})


def test_errors_name_the_problem() -> None:
    meta = BatchMeta(tuple(SampleMeta(i, "p", dict(FIELDS)) for i in range(3)))
    with pytest.raises(ConfigError, match="more than one meta"):
        BatchMeta.concat([meta, meta.select_samples([1])])
    with pytest.raises(ConfigError, match="out of range"):
        meta.select_samples([3])
    with pytest.raises(ConfigError, match="no field named"):
        meta.select_fields(["nope"])
    with pytest.raises(ConfigError, match=">= 1"):
        meta.chunk(0)
    other = BatchMeta((SampleMeta(1, "p", {"ids": FieldMeta("ids", "ndarray", "<f4", (16,))}),))
    with pytest.raises(ConfigError, match="field 'ids'"):
        meta.union(other)
    with pytest.raises(InvalidRecordError, match="not a BatchMeta"):
        BatchMeta.from_dict({"samples": [[1]]})


@settings(max_examples=60)
@given(
    st.integers(0, 10_000),
    st.integers(0, 40),
    st.sampled_from(["a", "b"]),
    st.lists(st.sampled_from(sorted(FIELDS)), unique=True),
)
def test_a_put_meta_built_lazily_is_the_meta_built_at_once(first: int, n: int, part: str, names: list[str]) -> None:
    """``BatchMeta.of_run`` (what put returns) answers every question as the meta of its samples built at once,
    before and after its samples are made, and pickles, compares and refuses writes alike."""
    fields = {name: FIELDS[name] for name in names}
    eager = BatchMeta(tuple(SampleMeta(i, part, dict(fields)) for i in range(first, first + n)))
    lazy = BatchMeta.of_run(first, n, part, fields)
    asked = ("size", "global_indexes", "partition_ids", "field_names", "is_ready", "custom_meta", "extra_info")
    for built in (False, True):  # before the samples are made, and after
        if built:
            assert lazy.samples == eager.samples
        assert {a: getattr(lazy, a) for a in asked} == {a: getattr(eager, a) for a in asked}
        assert len(lazy) == len(eager) and lazy == eager and repr(lazy) == repr(eager)
    fresh = BatchMeta.of_run(first, n, part, fields)
    assert pickle.loads(pickle.dumps(fresh)) == eager
    assert fresh.to_dict() == eager.to_dict()
    assert [m.global_indexes for m in fresh.chunk(3)] == [m.global_indexes for m in eager.chunk(3)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fresh.extra_info = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(fresh)
