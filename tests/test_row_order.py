"""A bucket's rows stay in index order through compaction, and a bucket that an older version's compaction
reordered is repaired at open, atomically (issue 37: mixed batch sizes, then a compaction, then a reopen).

Lance commits a compaction's fragments at the end of the fragment list; main before the fix did exactly that, so
``main_commit`` below restores its commit to write the stores an older version left behind.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from lance.optimize import Compaction

from persisting import Queue
from persisting.client import _loop
from persisting.storage import lance_compaction, lance_order

from .broker_fixture import BrokerProcess

# 1-sample batches between 8-sample ones: the 1-row fragments are the compaction's candidates, and runs of them
# that are not the tail are merged (where Lance's own commit reorders the bucket)
OPTIONS = {"compact_min_fragments": 4, "target_rows_per_fragment": 4, "retain_seconds": 0.0}
SAMPLE_FLOATS = 1024


def sizes(rounds: int) -> list[int]:
    return [8 if i % 3 == 0 else 1 for i in range(3 * rounds)]


def expected(batches: list[int]) -> list[int]:
    """The batch number of each row, in index order."""
    return [i for i, n in enumerate(batches) for _ in range(n)]


async def write(
    q: Queue, batches: list[int], floats: int = SAMPLE_FLOATS, maintain: bool = True, first: int = 0
) -> None:
    for i, n in enumerate(batches, first):
        await q.put({"x": np.full((n, floats), i, dtype=np.float32)}, partition_id="p")
        await q.flush()
        if maintain:  # as the background flusher does after a flush
            await _loop.call(q._handle.opened.engine_topic.maintain())  # type: ignore[union-attr]


async def read_back(q: Queue) -> list[int]:
    rows = await q.get(limit=10**6)  # in global index order: the batch numbers say whether it holds
    values = [np.asarray(r["x"]) for r in rows]
    assert all(v.min() == v.max() for v in values)
    return [int(v[0]) for v in values]


def bucket(store: Path, topic: str = "mixed") -> lance.LanceDataset:
    return lance.dataset(str(store / topic / "bucket-0.lance"))


def test_mixed_sizes_compaction_keeps_order_and_reopens(store: Path) -> None:
    batches = sizes(12)

    async def main() -> None:
        async with Queue("mixed", storage_path=store, num_buckets=1, backend_options=OPTIONS) as q:
            await write(q, batches)
            assert lance_order.disorder(bucket(store)) is None
            assert await read_back(q) == expected(batches)
        ds = bucket(store)
        assert len(ds.get_fragments()) < len(batches), "no compaction ran: the test tests nothing"
        async with Queue("mixed", storage_path=store, num_buckets=1, backend_options=OPTIONS) as q:
            assert await read_back(q) == expected(batches)
            more = sizes(4)
            await write(q, more, first=len(batches))  # compactions over fragments of both runs
            assert await read_back(q) == expected(batches + more)
        assert lance_order.disorder(bucket(store)) is None
        async with Queue("mixed", storage_path=store, num_buckets=1) as q:
            assert await read_back(q) == expected(batches + more)

    asyncio.run(main())


def main_commit(latest: lance.LanceDataset, rewrites: list[Any]) -> list[Any]:
    """What a compaction's commit was before the fix: Lance's own, which puts the merged fragments last."""
    Compaction.commit(latest, rewrites)
    return []


def write_as_main(store: Path, monkeypatch: pytest.MonkeyPatch, batches: list[int], floats: int) -> None:
    with monkeypatch.context() as patched:
        patched.setattr(lance_compaction.lance_order, "commit", main_commit)

        async def main() -> None:
            async with Queue("mixed", storage_path=store, num_buckets=1, backend_options=OPTIONS) as q:
                await write(q, batches, floats)

        asyncio.run(main())


@pytest.mark.parametrize(("rounds", "kind"), [(2, "fragments out of index order"), (12, "interleaved")])
def test_store_reordered_by_an_older_version_is_repaired_at_open(
    store: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, rounds: int, kind: str
) -> None:
    batches = sizes(rounds)
    write_as_main(store, monkeypatch, batches, SAMPLE_FLOATS)
    problem = lance_order.disorder(bucket(store))
    assert problem is not None and kind in problem, problem

    async def reopen() -> list[int]:
        async with Queue("mixed", storage_path=store, num_buckets=1) as q:
            return await read_back(q)

    with caplog.at_level(logging.WARNING, logger="persisting"):
        assert asyncio.run(reopen()) == expected(batches)
    repairs = [r for r in caplog.records if "out of index order" in r.getMessage()]
    assert len(repairs) == 1, [r.getMessage() for r in caplog.records]
    assert lance_order.disorder(bucket(store)) is None
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="persisting"):
        assert asyncio.run(reopen()) == expected(batches)  # idempotent: nothing left to repair, nothing logged
    assert not [r for r in caplog.records if "out of index order" in r.getMessage()]


def test_repair_keeps_the_deleted_rows_of_fragments_out_of_place(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fragment out of place with deleted rows (a purge) is not moved by the manifest (its new id would lose its
    deletion file, which Lance finds by the fragment's id): the rows are rewritten in order instead."""
    batches = sizes(2)
    write_as_main(store, monkeypatch, batches, SAMPLE_FLOATS)
    assert "fragments out of index order" in (lance_order.disorder(bucket(store)) or "")
    bucket(store).delete("_persisting_index = 12")  # a row of the 8-row fragment the repair must move
    want = expected(batches)
    del want[12]

    async def reopen() -> list[int]:
        async with Queue("mixed", storage_path=store, num_buckets=1) as q:
            return await read_back(q)

    assert asyncio.run(reopen()) == want
    assert lance_order.disorder(bucket(store)) is None
    assert asyncio.run(reopen()) == want


REPAIR = """
import asyncio, sys
from persisting import Queue
async def main():
    async with Queue("mixed", storage_path=sys.argv[1], num_buckets=1) as q:
        print(len(q), flush=True)
asyncio.run(main())
"""


@pytest.mark.slow
def test_kill_during_the_repair_leaves_an_openable_store(
    store: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """SIGKILL of a process at random moments of its open's repair (the interleaved case: a rewrite of every row);
    each later open finds the old or the new state and every row, in order."""
    rng = random.Random(seed)
    batches = sizes(12)
    write_as_main(store, monkeypatch, batches, 64 * 1024)  # 256 KiB samples: the rewrite takes a while
    assert "interleaved" in (lance_order.disorder(bucket(store)) or "")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", REPAIR, "/dev/null/x"], capture_output=True)  # interpreter start
    startup = time.monotonic() - started
    assert done.returncode != 0
    for _ in range(4):
        if lance_order.disorder(bucket(store)) is None:
            break
        proc = subprocess.Popen([sys.executable, "-c", REPAIR, str(store)], stdout=subprocess.DEVNULL)
        time.sleep(startup + rng.uniform(0.0, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    async def reopen() -> list[int]:
        async with Queue("mixed", storage_path=store, num_buckets=1) as q:
            return await read_back(q)

    assert asyncio.run(reopen()) == expected(batches)
    assert lance_order.disorder(bucket(store)) is None


def test_mixed_sizes_through_a_broker_reopen_in_order(tmp_path: Path) -> None:
    """The issue's script through a broker, at sizes where the broker's own compaction thresholds apply (16 small
    fragments): 16 MiB batches of 1 MiB samples with five 1-sample batches after each; the restarted broker reads
    every row in order."""
    b = BrokerProcess(tmp_path / "data", f"ipc://{tmp_path}/b.sock")
    b.start()
    floats = 1024 * 1024 // 4
    batches = [16 if i % 6 == 0 else 1 for i in range(6 * 4)]

    async def put_all() -> int:
        async with Queue("mixed", broker=b.address, num_buckets=1) as q:
            await write(q, batches, floats, maintain=False)
            fragments = 10**9
            for _ in range(40):  # the broker compacts after a flush, in the background
                await q.flush()
                fragments = (await q.stats())["buckets"][0]["fragments"]
                if fragments < len(batches):
                    break
                await asyncio.sleep(0.25)
            return int(fragments)

    async def read_all() -> list[int]:
        async with Queue("mixed", broker=b.address, num_buckets=1) as q:
            return await read_back(q)

    try:
        fragments = asyncio.run(put_all())
        assert fragments < len(batches), f"no compaction ran ({fragments} fragments)"
        b.stop()
        assert lance_order.disorder(bucket(tmp_path / "data")) is None
        b.start()
        assert asyncio.run(read_all()) == expected(batches)
    finally:
        b.stop()


def test_a_compaction_that_would_move_a_fragment_with_deleted_rows_is_not_committed(tmp_path: Path) -> None:
    """Lance finds a deletion file by its fragment's id, and a moved fragment gets a new id: the commit refuses
    (the compaction plans with every fragment that has deletions among its rewrites, so this is the last guard)."""
    uri = str(tmp_path / "b.lance")
    for first, n in [(0, 1), (1, 1), (2, 16)]:
        table = pa.table({"_persisting_index": pa.array(range(first, first + n), pa.int64())})
        lance.write_dataset(table, uri, mode="append", enable_stable_row_ids=True)
    ds = lance.dataset(uri)
    ds.delete("_persisting_index = 5")  # 1 of 16: under Lance's default 10%, so Lance's plan leaves it out
    ds = lance.dataset(uri)
    plan = Compaction.plan(ds, {"target_rows_per_fragment": 4})
    assert [sorted(f.id for f in t.fragments) for t in plan.tasks] == [[0, 1]]
    rewrites = [task.execute(ds) for task in plan.tasks]
    assert lance_order.commit(ds, rewrites) == rewrites
    after = lance.dataset(uri)
    assert after.version == ds.version
    assert after.to_table()["_persisting_index"].to_pylist() == [0, 1, 2, 3, 4, *range(6, 18)]
