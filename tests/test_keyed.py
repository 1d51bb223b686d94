"""Keyed samples (``Queue.kv_*``): the engine's key index, embedded and through a real broker (arena and copies).

What it proves: a key names one sample whatever the mix of new and known keys in a put; tags merge; fields merge
(latest write wins); a cleared key starts anew with no tags; every process sees every key at once (no replay);
a kill -9 of the broker loses no acknowledged key, field or tag, and the restarted broker finds them without a
flush or checkpoint; concurrent creators of one key end with one sample holding both writes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from persisting import Queue
from persisting.errors import ConfigError

from .broker_fixture import BrokerProcess, running_broker


def _queue(where: str, tmp_path: Path, broker: BrokerProcess | None) -> Queue:
    if where == "embedded":
        return Queue("kv", tmp_path / "data", num_buckets=1, objects="pickle")
    assert broker is not None
    mode = "off" if where == "copied" else "auto"
    return Queue("kv", tmp_path / "data", num_buckets=1, broker=broker.address, zerocopy_mode=mode, objects="pickle")


@pytest.fixture(params=["embedded", "arena", "copied"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_keys_fields_tags_and_clear(where: str, tmp_path: Path) -> None:
    async def scenario(b: BrokerProcess | None) -> None:
        q = _queue(where, tmp_path, b)
        x = np.arange(8, dtype=np.int64).reshape(2, 4)
        m = await q.kv_put(["a", "b"], {"x": x, "note": ["n0", "n1"]}, "p", tags=[{"s": 1}, {"s": 2}])
        assert [s.custom_meta for s in m.samples] == [{"s": 1}, {"s": 2}]
        ab = m.global_indexes
        # a mix of a known and a new key: one sample per key, the known one patched (its x stays)
        m = await q.kv_put(["b", "c"], {"y": np.ones(2, dtype=np.float32)}, "p", tags=[{"t": 1}, {}])
        assert m.global_indexes[0] == ab[1]
        assert [s.custom_meta for s in m.samples] == [{"s": 2, "t": 1}, {}]
        await q.kv_put(["a"], None, "p", tags=[{"s": 9}])  # tags only
        assert await q.kv_list() == {"p": {"a": {"s": 9}, "b": {"s": 2, "t": 1}, "c": {}}}
        data, meta = await q.kv_get(["b", "zz", "a"], "p", fields=["x", "y"])
        assert meta.extra_info["keys"] == ["b", "a"] and meta.extra_info["missing"] == ["zz"]
        assert meta.extra_info["fields"] == ["x"]  # "a" has no y: dropped
        assert np.array_equal(np.asarray(data["x"]), x[::-1])
        data, meta = await q.kv_get(["b", "c"], "p")
        assert meta.extra_info["fields"] == ["y"]
        assert await q.kv_names([*ab, 10**6], "p") == ["a", "b", None]
        assert await q.kv_clear(["a", "a", "zz"], "p") == 1
        assert await q.kv_clear(["a"], "p") == 0  # idempotent
        m = await q.kv_put(["a"], None, "p", tags=[{"new": 1}])
        assert m.global_indexes[0] not in ab and m.samples[0].custom_meta == {"new": 1}
        assert await q.kv_names([ab[0]], "p") == [None]
        with pytest.raises(ConfigError, match="twice"):
            await q.kv_put(["d", "d"], None, "p", tags=[{}, {}])
        with pytest.raises(ConfigError, match="list of str"):
            await q.kv_put("d", None, "p", tags=[{}])
        await q.aclose()

    if where == "embedded":
        asyncio.run(scenario(None))
    else:
        with running_broker(tmp_path, ["--arena-bytes", str(16 << 20)]) as b:
            asyncio.run(scenario(b))


def test_concurrent_creators_of_one_key_share_its_sample(tmp_path: Path) -> None:
    with running_broker(tmp_path, ["--arena-bytes", str(16 << 20)]) as b:

        async def scenario() -> None:
            q1, q2 = _queue("arena", tmp_path, b), _queue("arena", tmp_path, b)
            m1, m2 = await asyncio.gather(
                q1.kv_put(["k"], {"x": np.zeros((1, 3), dtype=np.int64)}, "p", tags=[{"one": 1}]),
                q2.kv_put(["k"], {"z": np.ones((1, 2), dtype=np.int64)}, "p", tags=[{"two": 2}]),
            )
            assert m1.global_indexes == m2.global_indexes
            _data, meta = await q1.kv_get(["k"], "p")
            assert sorted(meta.extra_info["fields"]) == ["x", "z"]
            assert meta.samples[0].custom_meta == {"one": 1, "two": 2}
            await q1.aclose()
            await q2.aclose()

        asyncio.run(scenario())


def test_broker_kill9_keeps_every_acknowledged_key(tmp_path: Path) -> None:
    with running_broker(tmp_path, ["--arena-bytes", str(16 << 20)]) as b:

        async def write() -> None:
            q = _queue("arena", tmp_path, b)
            for step in range(3):
                keys = [f"s{step}k{i}" for i in range(4)]
                x = np.full((4, 5), step, dtype=np.int64)
                await q.kv_put(keys, {"x": x}, "p", tags=[{"step": step}] * 4)
                await q.kv_put(keys[:2], None, "p", tags=[{"done": True}] * 2)
            await q.kv_clear(["s0k0"], "p")
            await q.aclose()

        asyncio.run(write())
        b.kill()  # SIGKILL: no flush, no clean close; everything lives in the log
        b.start()

        async def read() -> None:
            q = _queue("arena", tmp_path, b)
            listed = (await q.kv_list())["p"]
            assert "s0k0" not in listed and len(listed) == 11
            for step in range(3):
                assert listed[f"s{step}k1"] == {"step": step, "done": True}
                assert listed[f"s{step}k3"] == {"step": step}
            keys = [k for k in listed if k.startswith("s2")]
            data, _meta = await q.kv_get(keys, "p", fields=["x"])
            assert np.array_equal(np.asarray(data["x"]), np.full((4, 5), 2))
            await q.aclose()

        asyncio.run(read())


def test_samples_cleared_before_their_flush_are_never_written(tmp_path: Path) -> None:
    """A step's data cleared before the flush costs no Lance write (nor a purge later); the clear holds across a
    reopen, and indexes are never reused."""

    async def scenario() -> None:
        q = Queue("t", tmp_path / "d", num_buckets=1)
        gone = await q.put({"x": np.zeros((4, 3))}, partition_id="p")
        kept = await q.put({"x": np.ones((2, 3))}, partition_id="p")
        await q.clear(gone.global_indexes, partition_id="p")
        await q.flush()
        stats = await q.stats()
        assert stats["flushed"] == 6 and stats["buckets"][0]["stored"] == 2
        await q.aclose()
        q = Queue("t", tmp_path / "d", num_buckets=1)
        got = await q.get_data(kept)
        assert np.array_equal(np.asarray(got["x"]), np.ones((2, 3)))
        with pytest.raises(ConfigError, match="cleared"):
            await q.get_data(gone)
        again = await q.put({"x": np.zeros((1, 3))}, partition_id="p")
        assert again.global_indexes == [6]
        await q.aclose()

    asyncio.run(scenario())


def test_keys_of_samples_cleared_by_index_are_gone(tmp_path: Path) -> None:
    async def scenario() -> None:
        q = Queue("t", tmp_path / "d", num_buckets=1)
        m = await q.kv_put(["a", "b"], {"x": np.zeros((2, 2))}, "p", tags=[{"v": 1}, {"v": 2}])
        await q.clear([m.global_indexes[0]], partition_id="p")
        assert await q.kv_list("p") == {"p": {"b": {"v": 2}}}
        assert await q.kv_names(m.global_indexes, "p") == [None, "b"]
        _, meta = await q.kv_get(["a", "b"], "p")
        assert meta.extra_info["missing"] == ["a"]
        await q.clear(None, partition_id="p")
        again = await q.kv_put(["b"], None, "p", tags=[{"w": 1}])
        assert again.samples[0].custom_meta == {"w": 1} and again.global_indexes[0] not in m.global_indexes
        await q.aclose()

    asyncio.run(scenario())


def test_a_partition_cleared_whole_leaves_kv_list_one_whose_keys_were_cleared_stays(tmp_path: Path) -> None:
    """TransferQueue's rule: ``clear_partition`` drops the partition from ``kv_list``; ``kv_clear`` of every key
    leaves it listed, empty. A kill -9 of the broker brings neither back (the map rebuilt from the log sees the
    cleared rows, not purged yet); a key put again lists the partition again."""
    with running_broker(tmp_path, ["--arena-bytes", str(16 << 20)]) as b:

        async def before() -> None:
            q = _queue("arena", tmp_path, b)
            await q.kv_put(["a", "b"], {"x": np.zeros((2, 2))}, "gone", tags=[{"v": 1}, {"v": 2}])
            await q.kv_put(["c"], {"x": np.zeros((1, 2))}, "emptied", tags=[{"v": 3}])
            await q.kv_put(["d"], {"x": np.zeros((1, 2))}, "kept")
            await q.kv_put(["e"], {"x": np.zeros((1, 2))}, "late")
            await q.kv_clear(["c"], "emptied")
            await q.clear(None, partition_id="gone")
            assert await q.kv_list() == {"emptied": {}, "kept": {"d": {}}, "late": {"e": {}}}
            assert await q.kv_list("gone") == {}
            await q.aclose()

        asyncio.run(before())
        b.kill()  # SIGKILL: no purge at a clean close; the restarted broker rebuilds the map from the log
        b.start()

        async def after() -> None:
            q = _queue("arena", tmp_path, b)
            await q.clear(None, partition_id="late")  # before anything reads the map: it is built without "late"
            assert await q.kv_list() == {"kept": {"d": {}}}
            await q.kv_put(["a"], None, "gone", tags=[{"w": 1}])
            assert await q.kv_list("gone") == {"gone": {"a": {"w": 1}}}
            await q.aclose()

        asyncio.run(after())


def test_a_keyed_put_sent_again_with_its_key_answers_as_the_first(where: str, tmp_path: Path) -> None:
    """A keyed put re-sent with the idempotency key of one that was stored (a retry after a broker restart, as
    BrokerUnavailableError's key allows) stores nothing twice and answers with the keys' samples and tags."""

    async def scenario(b: BrokerProcess | None) -> None:
        q = _queue(where, tmp_path, b)
        x = np.arange(8, dtype=np.int64).reshape(2, 4)
        first = await q.kv_put(["a", "b"], {"x": x}, "p", tags=[{"s": 1}, {"s": 2}], idempotency_key="put-1")
        again = await q.kv_put(["a", "b"], {"x": x}, "p", tags=[{"s": 1}, {"s": 2}], idempotency_key="put-1")
        assert again.global_indexes == first.global_indexes
        assert [s.custom_meta for s in again.samples] == [{"s": 1}, {"s": 2}]
        assert len(q) == 2  # stored once
        data, _ = await q.kv_get(["a", "b"], "p")
        assert np.array_equal(np.asarray(data["x"]), x)
        await q.aclose()

    if where == "embedded":
        asyncio.run(scenario(None))
    else:
        with running_broker(tmp_path, ["--arena-bytes", str(16 << 20)]) as b:
            asyncio.run(scenario(b))
