"""Cleared samples leaving Lance while a topic runs (the purge), with readers reading through it and with the
broker killed at random moments around it."""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import Queue
from persisting.engine import partitions
from persisting.storage import LanceBackend
from persisting.wire.codec import INDEX_KEY, OF_KEY

from .broker_fixture import make_broker
from .test_fields import lance_count


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "data"


def test_a_running_topic_purges_cleared_rows_while_readers_read(
    store: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Cleared rows leave Lance while the topic runs (not only at the next open), and readers streaming through
    the purges never see a row moved, lost or doubled: every page is in order, holds no cleared sample once its
    clear returned, and every sample never cleared."""
    monkeypatch.setattr(partitions, "PURGE_SPACING_SECONDS", 0.05)
    slow_read_column = LanceBackend.read_column

    async def read_column(self: LanceBackend, name: str) -> list[Any]:
        # A purge deletes, then reloads the index column: widen that window, where a read planned on the old
        # positions would meet the new dataset (the gate must keep reads out of it).
        values = await slow_read_column(self, name)
        await asyncio.sleep(0.02)
        return values

    monkeypatch.setattr(LanceBackend, "read_column", read_column)
    rng = random.Random(seed)
    n = 3000

    async def main() -> None:
        async with Queue("purge", store, batch_size=200, num_buckets=2, bucket_column="b") as q:
            for k in range(0, n, 500):
                await q.put({"x": np.arange(k, k + 500)}, partition_id="p")
            await q.flush()
            cleared: set[int] = set()  # global index == x here
            stop = asyncio.Event()
            pages = 0

            async def reader() -> None:
                nonlocal pages
                while not stop.is_set():
                    gone = set(cleared)  # cleared before this read began: must not come back
                    got = []
                    for offset in range(0, n, 250):  # pages by global index, as stream() reads
                        got += [int(r["x"]) for r in await q.get(limit=250, offset=offset)]
                    assert got == sorted(set(got)), f"seed {seed}: rows out of order or doubled"
                    assert not gone & set(got), f"seed {seed}: a cleared sample came back"
                    missing = set(range(n)) - cleared - set(got)
                    assert not missing, f"seed {seed}: never-cleared samples missing: {sorted(missing)[:5]}"
                    pages += 1
                    await asyncio.sleep(0)

            readers = [asyncio.create_task(reader()) for _ in range(3)]
            for _ in range(8):
                live = sorted(set(range(n)) - cleared)
                chosen = rng.sample(live, rng.randint(1, 200))
                assert await q.clear(chosen, partition_id="p") == len(chosen)
                cleared.update(chosen)
                await asyncio.sleep(0.1)
            deadline = asyncio.get_running_loop().time() + 20
            while _lance_rows(store / "purge") != n - len(cleared):
                assert asyncio.get_running_loop().time() < deadline, (
                    f"seed {seed}: cleared rows still in Lance: {_lance_rows(store / 'purge')} rows for "
                    f"{n - len(cleared)} live samples"
                )
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*readers)
            assert pages > 0
            assert [int(r["x"]) for r in await q.get(limit=n)] == sorted(set(range(n)) - cleared)
            meta = await q.get_meta(["x"], n, "train", "p")
            assert meta.global_indexes == sorted(set(range(n)) - cleared)
            assert (await q.get_data(meta))["x"].tolist() == meta.global_indexes
        async with Queue("purge", store, bucket_column="b", num_buckets=2) as q:  # reopened: the same
            assert [int(r["x"]) for r in await q.get(limit=n)] == sorted(set(range(n)) - cleared)

    asyncio.run(main())


def _lance_rows(topic: Path) -> int:
    return sum(lance_count(b) for b in topic.glob("bucket-*.lance"))


def _index_and_of(topic: Path) -> list[tuple[int, int | None]]:
    """Every row in a topic's Lance datasets: (its global index, the sample a patch row writes, or None)."""
    import lance

    out = []
    for bucket in sorted(topic.glob("bucket-*.lance")):
        ds = lance.dataset(str(bucket))
        indexes = ds.to_table(columns=[INDEX_KEY])[INDEX_KEY].to_pylist()
        # a bucket that never held a patch row has no such column
        ofs = ds.to_table(columns=[OF_KEY])[OF_KEY].to_pylist() if OF_KEY in ds.schema.names else [None] * len(indexes)
        out += zip(indexes, ofs, strict=True)
    return out


@pytest.mark.slow
def test_puts_and_clears_survive_kill_9_of_the_broker_at_random_moments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """A client puts tensor batches, writes a field of some later, tags some and clears samples without pause,
    and a consumer takes batches of them
    (consume-on-fetch, task "train"), while the broker is killed (SIGKILL) and restarted three times, purging
    meanwhile (every 50 ms). Every call returns (retried across the restarts); afterwards every acknowledged
    sample not cleared is there exactly once with its values, and no cleared one is, in get(), get_meta() and
    Lance itself; and "train" got no sample twice and every sample never cleared once.

    Seed 2797819804 once saw get_batch hand out another batch's values: the broker had died between its answer
    and the consumer's mapping of its arena, and the consumer mapped the next broker's (test_arena_restarts
    drives that moment exactly). Replay a seed with PERSISTING_TEST_SEED=<n>."""
    monkeypatch.setenv("PERSISTING_PURGE_SPACING", "0.05")  # read by the broker subprocess at start
    rng = random.Random(seed)
    broker = make_broker(tmp_path)
    broker.extra_args = ["--arena-bytes", str(64 * 1024 * 1024)]
    broker.start()
    value_of: dict[int, int] = {}  # global index -> its value, for every acknowledged put
    cleared: set[int] = set()  # acknowledged clears
    taken: list[int] = []  # what the consumer got, in order
    fetched: list[tuple[int, int]] = []  # (global index, x) as get_batch handed them out
    reward_of: dict[int, int] = {}  # field "r" written later (acknowledged patches)
    tag_of: dict[int, int] = {}  # stored tags (acknowledged set_custom_meta)

    async def client(done: asyncio.Event) -> None:
        async with Queue("kc", broker=broker.address, durability="process") as q:
            next_value = 0
            # Until done, and at least one clear: on a loaded machine (load 12 on 2 cores) a few puts could fit
            # before done with no clear among them (seed 4261174852: 38 samples, none cleared).
            while not done.is_set() or not cleared:
                n = rng.randint(1, 16)
                values = np.arange(next_value, next_value + n, dtype=np.int64)
                meta = await q.put({"x": values, "y": np.ones((n, 64), np.float32)}, partition_id="p")
                value_of.update(zip(meta.global_indexes, values.tolist(), strict=True))
                next_value += n
                if rng.random() < 0.3 and not cleared & set(meta.global_indexes):
                    await q.put({"r": values * 10}, partition_id="p", batch_meta=meta)  # a reward, later
                    reward_of.update(zip(meta.global_indexes, (values * 10).tolist(), strict=True))
                if rng.random() < 0.2 and not cleared & set(meta.global_indexes):
                    await q.set_custom_meta(meta.with_custom_meta({i: {"t": i} for i in meta.global_indexes}))
                    tag_of.update((i, i) for i in meta.global_indexes)
                if rng.random() < 0.3:
                    live = sorted(set(value_of) - cleared)
                    chosen = rng.sample(live, min(len(live), rng.randint(1, 8)))
                    await q.clear(chosen, partition_id="p")
                    cleared.update(chosen)

    async def consumer(finished: asyncio.Event) -> None:
        async with Queue("kc", broker=broker.address, durability="process") as q:
            while True:
                if rng.random() < 0.5:
                    meta = await q.get_meta(["x"], 8, "train", "p", wait=True, timeout=0.2)
                else:  # take and data in one request
                    data, meta = await q.get_batch(["x"], 8, "train", "p", wait=True, timeout=0.2)
                    if meta.size:  # checked at the end: the producer may not have seen its put's answer yet
                        fetched.extend(zip(meta.global_indexes, data["x"].tolist(), strict=True))
                taken.extend(meta.global_indexes)
                if finished.is_set() and meta.size == 0:  # the client's last put was acknowledged before
                    return

    async def main() -> None:
        done, finished = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(client(done))
        eater = asyncio.create_task(consumer(finished))
        for _ in range(3):
            await asyncio.sleep(rng.uniform(0.2, 0.8))
            await asyncio.to_thread(broker.stop, signal.SIGKILL)
            await asyncio.to_thread(broker.start)
        await asyncio.sleep(0.3)
        done.set()
        await asyncio.wait_for(task, 60)
        finished.set()
        await asyncio.wait_for(eater, 60)

    try:
        asyncio.run(main())
        live = sorted(set(value_of) - cleared)
        assert len(live) > 0 and cleared, f"seed {seed}: the workload did too little"
        assert len(taken) == len(set(taken)), f"seed {seed}: the consumer got a sample twice"
        missed = set(live) - set(taken)
        assert not missed, f"seed {seed}: samples never handed to the consumer: {sorted(missed)[:10]}"
        assert set(taken) <= set(value_of), f"seed {seed}: the consumer got samples nobody put"
        assert all(value_of[i] == x for i, x in fetched), f"seed {seed}: get_batch handed out wrong values"

        async def check() -> None:
            async with Queue("kc", broker=broker.address, durability="process") as q:
                rows = await q.get(limit=10**6)
                got = [int(r["x"]) for r in rows if "x" in r]
                assert got == [value_of[i] for i in live], f"seed {seed}: get() after the kills"
                meta = await q.get_meta(["x", "y"], 10**6, "fresh", "p")
                assert meta.global_indexes == live, f"seed {seed}: get_meta() after the kills"
                data = await q.get_data(meta)
                assert data["x"].tolist() == [value_of[i] for i in live], f"seed {seed}: get_data()"
                tags = {i: t["t"] for i, t in zip(meta.global_indexes, meta.custom_meta, strict=True) if t}
                assert tags == {i: t for i, t in tag_of.items() if i in set(live)}, f"seed {seed}: tags"
                rewarded = await q.get_meta(["x", "r"], 10**6, "fresh-r", "p")
                want = sorted(set(reward_of) & set(live))
                assert rewarded.global_indexes == want, f"seed {seed}: samples with their field r"
                got_r = (await q.get_data(rewarded))["r"].tolist() if want else []
                assert got_r == [reward_of[i] for i in want], f"seed {seed}: values of r"

        asyncio.run(check())
        assert broker.stop() == 0
        broker.start()  # the open after a clean stop purges whatever a kill left behind
        assert broker.stop() == 0
        stored = sum(lance_count(b) for b in (broker.storage / "kc").glob("bucket-*.lance"))
        rows_left = len(live) + len(set(reward_of) & set(live))  # a later field is a row of its own (a patch)
        if stored != rows_left:  # say which rows (once seen: 280 rows for 279, seed 1514777199, cause unknown)
            rows, alive = _index_and_of(broker.storage / "kc"), set(live)
            extra = [(i, of) for i, of in rows if (i if of is None else of) not in alive]
            extra += [(i, of) for i, of in rows if of is not None and of in alive and of not in reward_of]
            patched = Counter(of for _, of in rows if of is not None)
            twice = [(of, n, of in cleared, of in tag_of) for of, n in patched.items() if n > 1]
            doubled = [i for i, n in Counter(i for i, _ in rows).items() if n > 1]
            raise AssertionError(
                f"seed {seed}: {stored} rows in Lance, {rows_left} expected; rows of no live sample or reward "
                f"(index, sample it patches): {extra[:10]}; samples patched more than once (sample, rows, "
                f"cleared, tagged): {twice[:10]}; indexes stored twice: {doubled[:10]}"
            )
    finally:
        broker.ensure_dead()


def test_a_partition_whose_samples_were_all_cleared_stays_listed_after_the_purge(store: Path) -> None:
    """Found by test_bookkeeping's model (seed 2911956526): once a clean close had purged every row of a fully
    cleared partition, partitions() forgot the partition and the tasks' consumption in it."""

    async def main() -> None:
        async with Queue("gone", storage_path=store) as q:
            meta = await q.put({"x": np.zeros((4, 2), np.float32)}, partition_id="p")
            await q.get_meta(["x"], 2, "train", "p")
            assert await q.clear(meta, partition_id="p") == 4
        async with Queue("gone", storage_path=store) as q:
            listed = await q.partitions()
            assert listed["p"] == {"samples": 0, "cleared": 4, "tasks": {"train": {"consumed": 0, "leased": 0}}}
            assert await q.get(limit=10) == []  # the rows did go

    asyncio.run(main())
