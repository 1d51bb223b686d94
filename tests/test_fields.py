"""Per-field readiness: samples written in several steps (put with batch_meta), in embedded and broker mode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from persisting import BatchMeta, ConfigError, Queue, SchemaConflictError, SyncQueue
from persisting.engine import consumption
from persisting.storage import LanceBackend
from persisting.tensors.meta import ProductionStatus, SampleMeta

from .broker_fixture import BrokerProcess


def test_a_sample_is_handed_out_once_every_field_asked_for_is_written(store: Path) -> None:
    with SyncQueue("f", store) as q:
        meta = q.put({"x": np.arange(16).reshape(8, 2)}, partition_id="p")
        assert q.get_meta(["x", "reward"], 8, "train", "p").size == 0  # no reward yet: nothing is ready
        first = meta.select_samples(range(4))
        patched = q.put({"reward": np.arange(4, dtype=np.float32)}, partition_id="p", batch_meta=first)
        assert patched.global_indexes == [0, 1, 2, 3] and set(patched.field_names) == {"x", "reward"}
        got = q.get_meta(["x", "reward"], 8, "train", "p")
        assert got.global_indexes == [0, 1, 2, 3] and got.is_ready
        data = q.get_data(got)
        assert data["x"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert data["reward"].tolist() == [0.0, 1.0, 2.0, 3.0]
        # another task asking only for x was never held back, and patch rows are never samples
        assert q.get_meta(["x"], 100, "other", "p").global_indexes == list(range(8))
        assert q.get_meta(None, 100, "all", "p").global_indexes == list(range(8))


def test_check_ready_reports_each_fields_production_status(store: Path) -> None:
    with SyncQueue("f", store) as q:
        meta = q.put({"x": np.zeros((3, 2))}, partition_id="p")
        q.put({"score": [0.5]}, partition_id="p", batch_meta=meta.select_samples([1]))
        status = q.check_ready(meta, ["x", "score"])
        assert [s.is_ready for s in status.samples] == [False, True, False] and not status.is_ready
        field = status.samples[0].fields["score"]
        assert field.production_status == ProductionStatus.NOT_PRODUCED and not field.is_ready
        assert status.samples[1].fields["score"].is_ready and status.samples[0].fields["x"].is_ready
        assert q.check_ready(meta.select_samples([1]), ["x", "score"]).is_ready


def test_a_field_written_again_reads_back_as_its_latest_value(store: Path) -> None:
    with SyncQueue("f", store) as q:
        meta = q.put({"x": np.arange(3), "tag": ["a", "b", "c"]}, partition_id="p")
        q.put({"tag": ["B"]}, partition_id="p", batch_meta=meta.select_samples([1]))
        q.put({"tag": ["A", "BB"]}, partition_id="p", batch_meta=meta.select_samples([0, 1]))
        assert q.get_data(q.get_meta(["x", "tag"], 3, "t", "p"))["tag"] == ["A", "BB", "c"]


def test_fields_and_readiness_survive_a_reopen(store: Path) -> None:
    with SyncQueue("f", store) as q:
        meta = q.put({"x": np.arange(6)}, partition_id="p")
        q.put({"y": np.arange(3) * 10}, partition_id="p", batch_meta=meta.select_samples([0, 2, 4]))
        q.put({"x": np.arange(2) + 100}, partition_id="p")  # new samples without y
    with SyncQueue("f", store) as q:  # everything was flushed to Lance at close: rebuilt from its columns
        got = q.get_meta(["x", "y"], 10, "t", "p")
        assert got.global_indexes == [0, 2, 4]
        data = q.get_data(got)
        assert data["x"].tolist() == [0, 2, 4] and data["y"].tolist() == [0, 10, 20]
        assert q.get_meta(["x"], 10, "t2", "p").size == 8


def test_waiting_for_a_field_is_woken_by_the_put_that_writes_it(store: Path) -> None:
    async def go() -> None:
        async with Queue("f", store) as q:
            meta = await q.put({"x": np.arange(4)}, partition_id="p")
            waiter = asyncio.ensure_future(q.get_meta(["x", "r"], 4, "train", "p", wait=True, timeout=10))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            await q.put({"r": [1, 2, 3, 4]}, partition_id="p", batch_meta=meta)
            got = await asyncio.wait_for(waiter, 5)
            assert got.global_indexes == [0, 1, 2, 3]

    asyncio.run(go())


def test_bad_patches_are_refused_and_leave_the_queue_usable(store: Path) -> None:
    with SyncQueue("f", store) as q:
        meta = q.put({"x": np.arange(4)}, partition_id="p")
        other = q.put({"x": np.arange(2)}, partition_id="q")
        with pytest.raises(ConfigError, match="2 samples but batch_meta names 4"):
            q.put({"r": [1, 2]}, partition_id="p", batch_meta=meta)
        with pytest.raises(ConfigError, match="not of 'p'"):
            q.put({"r": [1, 2]}, partition_id="p", batch_meta=other)
        patch = q.put({"r": [1]}, partition_id="p", batch_meta=meta.select_samples([0]))
        for bogus in (99, 6):  # an index never given out; the patch row just written (not a sample)
            fake = BatchMeta.from_dict({"samples": [[bogus, "p", [], {}]]})
            with pytest.raises(ConfigError, match="no samples with global indexes"):
                q.put({"r": [1]}, partition_id="p", batch_meta=fake)
        assert patch.global_indexes == [0]
        with pytest.raises(SchemaConflictError):
            q.put({"x": ["not an int array"] * 4}, partition_id="p", batch_meta=meta)
        assert q.get_meta(["x"], 10, "t", "p").global_indexes == [0, 1, 2, 3]


@pytest.mark.slow
def test_fields_through_the_broker_arena_and_after_a_kill_9(broker: BrokerProcess) -> None:
    async def before() -> None:
        async with Queue("bf", broker=broker.address, durability="process") as q:
            meta = await q.put({"x": np.arange(12, dtype=np.int64).reshape(6, 2)}, partition_id="p")
            assert (await q.get_meta(["x", "logp"], 6, "train", "p")).size == 0
            logp = np.arange(6, dtype=np.float32).reshape(3, 2) / 2
            await q.put(
                {"logp": logp, "ok": [True, False, True]}, partition_id="p", batch_meta=meta.select_samples([2, 3, 4])
            )
            data, got = await q.get_batch(["x", "logp", "ok"], 6, "train", "p")
            assert got.global_indexes == [2, 3, 4]
            assert data["x"].tolist() == [[4, 5], [6, 7], [8, 9]]
            assert data["logp"].tolist() == logp.tolist() and data["ok"] == [True, False, True]
            # views on the arena (a mapping of its file), both the sample's and the patch's field
            maps = [ln.split() for ln in Path("/proc/self/maps").read_text().splitlines()]
            arena = [[int(a, 16) for a in m[0].split("-")] for m in maps if m[5:6] and "/persisting-" in m[5]]
            assert all(any(lo <= data[f].ctypes.data < hi for lo, hi in arena) for f in ("x", "logp"))
            data.release()
            status = await q.check_ready(meta, ["x", "logp"])
            assert [s.is_ready for s in status.samples] == [False, False, True, True, True, False]

    asyncio.run(before())
    broker.kill()  # nothing was flushed on purpose: the log replay rebuilds fields and patches
    broker.start()

    async def after() -> None:
        async with Queue("bf", broker=broker.address, durability="process") as q:
            assert (await q.get_meta(["x", "logp"], 6, "train", "p")).size == 0  # taken before the kill
            got = await q.get_meta(["x", "logp"], 6, "again", "p")
            assert got.global_indexes == [2, 3, 4]
            data = await q.get_data(got)
            assert data["logp"].tolist() == [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]]
            assert data["x"].tolist() == [[4, 5], [6, 7], [8, 9]]

    asyncio.run(after())
    assert broker.stop() == 0


def test_clear_deletes_samples_and_changes_no_other_index(store: Path) -> None:
    with SyncQueue("c", store, batch_size=1000) as q:
        meta = q.put({"x": np.arange(10)}, partition_id="p")
        q.put({"x": np.arange(3) + 50}, partition_id="other")
        assert q.get_meta(["x"], 2, "train", "p").global_indexes == [0, 1]
        assert q.clear([2, 3, 7], partition_id="p") == 3
        assert q.clear(meta.select_samples([2]), partition_id="p") == 0  # already cleared: nothing new
        with pytest.raises(ConfigError, match="has no samples with global indexes"):
            q.clear([10], partition_id="p")  # a sample of another partition
        assert q.get_meta(["x"], 100, "train", "p").global_indexes == [4, 5, 6, 8, 9]
        assert q.get_meta(["x"], 100, "fresh", "p").global_indexes == [0, 1, 4, 5, 6, 8, 9]
        with pytest.raises(ConfigError, match=r"\[2, 3\] were cleared"):
            q.get_data(meta.select_samples([1, 2, 3]))
        with pytest.raises(ConfigError, match=r"\[7\] were cleared"):
            q.put({"y": [1]}, partition_id="p", batch_meta=meta.select_samples([7]))
        kept = [r["x"].item() for r in q.get(limit=100)]
        assert kept == [0, 1, 4, 5, 6, 8, 9, 50, 51, 52]  # records skip cleared rows; stream too
        assert [r["x"].item() for page in q.stream() for r in page] == kept
        parts = q.partitions()
        assert parts["p"]["samples"] == 7 and parts["p"]["cleared"] == 3 and parts["other"]["samples"] == 3
        assert parts["p"]["tasks"]["train"]["consumed"] == 7
        assert q.get_data(q.get_meta(["x"], 3, "t", "other"))["x"].tolist() == [50, 51, 52]
    lance_rows = sum(lance_count(b) for b in (store / "c").glob("bucket-*.lance"))
    assert lance_rows == 10  # the cleared rows left Lance while running or, at the latest, at close
    with SyncQueue("c", store) as q:
        assert sum(lance_count(b) for b in (store / "c").glob("bucket-*.lance")) == 10
        assert q.clear([2, 3, 7], partition_id="p") == 0  # cleared already (a re-sent clear): purged rows or not
        with pytest.raises(ConfigError, match=r"has no samples with global indexes \[2\]"):
            q.clear([2], partition_id="other")  # but not a sample another partition had
        assert q.get_meta(["x"], 100, "fresh2", "p").global_indexes == [0, 1, 4, 5, 6, 8, 9]
        assert [r["x"].item() for r in q.get(limit=100)] == [0, 1, 4, 5, 6, 8, 9, 50, 51, 52]
        assert q.get_data(q.get_meta(["x"], 100, "t2", "other"))["x"].tolist() == [50, 51, 52]
        assert q.clear(None, partition_id="other") == 3
        assert q.partitions()["other"] == {
            "samples": 0,
            "cleared": 3,
            "tasks": {"t": {"consumed": 0, "leased": 0}, "t2": {"consumed": 0, "leased": 0}},
        }
        q.put({"x": np.arange(2) + 90}, partition_id="p")  # new samples continue the indexes
        assert q.get_meta(["x"], 100, "fresh", "p").global_indexes == [13, 14]


def lance_count(uri: Path) -> int:
    import lance

    return int(lance.dataset(str(uri)).count_rows())


def test_tags_are_stored_with_the_samples_and_survive_a_reopen(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scored = {"score": 0.75, "ok": True}
    with SyncQueue("t", store) as q:
        meta = q.put({"x": np.arange(6)}, partition_id="p")
        other = q.put({"x": np.arange(2)}, partition_id="o")
        q.set_custom_meta(meta.with_custom_meta({1: {"score": 0.5, "ok": True}, 2: {"score": 1.0}}))
        q.set_custom_meta(meta.with_custom_meta({1: {"score": 0.75}}))  # merged; a key set again takes the new value
        q.set_custom_meta(other.with_custom_meta({other.global_indexes[0]: {"src": "o"}}))
        assert q.get_meta(["x"], 6, "train", "p").custom_meta == [{}, scored, {"score": 1.0}, {}, {}, {}]
        _, got = q.get_batch(["x"], 6, "again", "p")
        assert got.custom_meta == [{}, scored, {"score": 1.0}, {}, {}, {}]
        assert q.get_meta(["x"], 6, "train", "o").custom_meta == [{"src": "o"}, {}]
        draft = meta.with_custom_meta({3: {"draft": 1}})  # not stored: check_ready keeps it over the stored ones
        assert q.check_ready(draft).custom_meta[1:4] == [scored, {"score": 1.0}, {"draft": 1}]
        # bad tags: a clear error naming what is wrong, nothing stored
        stranger = BatchMeta((SampleMeta(99, "p", {}, {"a": 1}),), {})
        with pytest.raises(ConfigError, match=r"has no samples with global indexes \[99\]"):
            q.set_custom_meta(stranger)
        with pytest.raises(ConfigError, match="msgpack-safe"):
            q.set_custom_meta(meta.with_custom_meta({4: {"f": object()}}))
        with pytest.raises(ConfigError, match="takes a BatchMeta"):
            q.set_custom_meta({4: {"a": 1}})  # type: ignore[arg-type]
        q.clear([5], partition_id="p")
        with pytest.raises(ConfigError, match=r"\[5\] were cleared"):
            q.set_custom_meta(meta.with_custom_meta({5: {"a": 1}}))
        assert q.check_ready(meta.select_samples([4])).custom_meta == [{}]
    for task in ("fresh", "fresher"):  # reopened: first from the log's records, then from the snapshot that open wrote
        monkeypatch.setattr(consumption, "COMPACT_AT_BYTES", 0)  # every open rewrites the log as a snapshot
        with SyncQueue("t", store) as q:
            got = q.get_meta(["x"], 6, task, "p")
            assert got.global_indexes == [0, 1, 2, 3, 4]
            assert got.custom_meta == [{}, scored, {"score": 1.0}, {}, {}]
            assert q.get_meta(["x"], 6, task, "o").custom_meta == [{"src": "o"}, {}]


@pytest.mark.slow
def test_clear_and_tags_through_the_broker_survive_a_kill_9(broker: BrokerProcess) -> None:
    async def before() -> None:
        async with Queue("bc", broker=broker.address, durability="sync") as q:
            meta = await q.put({"x": np.arange(8, dtype=np.float32)}, partition_id="p")
            assert await q.clear([0, 5], partition_id="p") == 2
            assert (await q.partitions())["p"]["cleared"] == 2
            await q.set_custom_meta(meta.with_custom_meta({1: {"reward": 1.5}, 7: {"reward": -1}}))
            with pytest.raises(ConfigError, match="were cleared"):
                await q.set_custom_meta(meta.with_custom_meta({0: {"reward": 0}}))

    asyncio.run(before())
    broker.kill()
    broker.start()

    async def after() -> None:
        async with Queue("bc", broker=broker.address, durability="sync") as q:
            got = await q.get_meta(["x"], 100, "train", "p")
            assert got.global_indexes == [1, 2, 3, 4, 6, 7]
            assert got.custom_meta == [{"reward": 1.5}, {}, {}, {}, {}, {"reward": -1}]
            assert (await q.get_data(got))["x"].tolist() == [1, 2, 3, 4, 6, 7]
            assert [r["x"].item() for r in await q.get(limit=100)] == [1, 2, 3, 4, 6, 7]

    asyncio.run(after())
    assert broker.stop() == 0


def test_a_patch_counts_only_once_it_is_acknowledged(store: Path) -> None:
    """A patch appended but not yet durable must not make a sample ready, nor be where its field is read from:
    a crash before the sync would lose a field that a consumer was already given."""
    from persisting.engine.config import TopicConfig
    from persisting.engine.topic import Topic
    from persisting.wire import codec

    async def main() -> None:
        topic = Topic("pend", store, TopicConfig(), LanceBackend)
        await topic.open()
        try:
            samples = codec.encode_batch([{"x": 1}, {"x": 2}], topic.kinds)
            await topic.append(samples, "p", codec.pack(samples.rows))

            async def patch(values: list[float], of: list[int]) -> tuple[int, int]:
                batch = codec.encode_batch([{"r": v} for v in values], topic.kinds)
                return await topic.append(batch, "p", codec.pack(batch.rows), of=of)

            first, _ = await patch([0.5], [0])
            wal = topic._wal
            assert wal is not None
            gate = asyncio.Event()
            real_commit = wal.commit

            async def held_commit(upto: int | None = None) -> None:
                await gate.wait()
                await real_commit(upto)

            wal.commit = held_commit  # type: ignore[method-assign]
            pending = asyncio.create_task(patch([0.75, 0.25], [0, 1]))  # appended to the log, its sync held back
            while topic.next_index < first + 3:
                await asyncio.sleep(0)
            assert topic.visible_upto == first + 1
            assert (await topic.field_index()).source(0, "r") == first  # still read from the acknowledged patch
            other = codec.encode_batch([{"x": 3}], topic.kinds)
            waiting = asyncio.create_task(topic.append(other, "p", codec.pack(other.rows)))
            for _ in range(10):
                await asyncio.sleep(0)
            assert await topic.take("p", "t", 2, 0.0, None, None, fields=["x", "r"]) == [0]  # not sample 1
            gate.set()
            assert (await pending)[0] == first + 1 and await waiting == (first + 3, 1)
            assert (await topic.field_index()).source(0, "r") == first + 1  # acknowledged: the latest write wins
            assert await topic.take("p", "t", 2, 0.0, None, None, fields=["x", "r"]) == [1]
            assert (await topic.read(first + 1, 1))[0][0]["r"] == 0.75
        finally:
            await topic.close()

    asyncio.run(main())


def test_close_takes_rows_whose_put_still_waited_for_its_sync(store: Path) -> None:
    """A put cancelled while its sync runs (a broker's request at shutdown) leaves rows in the log that it never
    marked acknowledged; close flushes them too, so nothing stays in the log alone (a broker removes its arena
    after a clean stop: such rows would come back without their tensors)."""
    from persisting.engine.config import TopicConfig
    from persisting.engine.topic import Topic
    from persisting.errors import QueueClosedError
    from persisting.wire import codec

    async def main() -> None:
        topic = Topic("settle", store, TopicConfig(), LanceBackend)
        await topic.open()
        samples = codec.encode_batch([{"x": 1}, {"x": 2}], topic.kinds)
        await topic.append(samples, "p", codec.pack(samples.rows))
        patch = codec.encode_batch([{"r": 0.5}], topic.kinds)
        task = asyncio.create_task(topic.append(patch, "p", codec.pack(patch.rows), of=[1]))
        while topic.next_index < 3:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await topic.close()
        assert topic.flushed_upto == 3
        with pytest.raises(QueueClosedError):
            await topic.append(samples, "p", codec.pack(samples.rows))
        reopened = Topic("settle", store, TopicConfig(), LanceBackend)
        await reopened.open()
        try:
            assert await reopened.take("p", "t", 2, 0.0, None, None, fields=["x", "r"]) == [1]
            assert (await reopened.read(2, 1))[0][0]["r"] == 0.5
        finally:
            await reopened.close()

    asyncio.run(main())
