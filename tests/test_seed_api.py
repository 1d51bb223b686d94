"""The seed API's ``KVInterface`` and samplers behave as Persisting 0.3.0's users rely on (issue 33).

From the seed's API table: ``kv_list(partition_id)`` lists key -> tag pairs (as ``(key, tag)`` pairs in insertion
order: users index ``listed[0][0]``); ``kv_batch_get(keys, partition_id)`` gives no entry for a key cleared or
never put; ``RankAwareSampler().sample(...)`` gives every rank of one data-parallel group the same batch;
``GRPOGroupNSampler(n).sample(ready_indexes, batch_size)`` groups runs of n consecutive indexes. The samplers'
direct calls are also compared with TransferQueue 0.1.11's samplers, whose semantics the seed's took.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from persisting import ConfigError, GRPOGroupNSampler, KVInterface, Queue, RankAwareSampler, SyncQueue


def test_kv_list_gives_key_tag_pairs_in_insertion_order(store: Path) -> None:
    async def go() -> None:
        async with Queue("kv_store", storage_path=str(store)) as q:
            kv = KVInterface(q)
            await kv.kv_put("first", {"v": 1}, "p", tag="t1")
            await kv.kv_batch_put(["second", "third"], [{"v": 2}, {"v": 3}], "p", tags=["t2", "t3"])
            await kv.kv_put("first", {"v": 10}, "p", tag="t1b")  # an update keeps the key's place
            listed = await kv.kv_list("p")
            assert listed[0][0] == "first" and listed[0][1] == "t1b"
            assert listed == [("first", "t1b"), ("second", "t2"), ("third", "t3")]
            assert dict(listed) == {"first": "t1b", "second": "t2", "third": "t3"}
            await kv.kv_clear(["first"], "p")
            await kv.kv_put("first", {"v": 0}, "p")  # cleared, then put again: inserted anew, so last
            assert [key for key, _tag in await kv.kv_list("p")] == ["second", "third", "first"]
            assert await kv.kv_list("empty") == []
            with pytest.raises(ConfigError, match="partition_id"):
                await kv.kv_list("")
        async with Queue("kv_store", storage_path=str(store)) as q:  # the same order after a reopen
            assert [key for key, _tag in await KVInterface(q).kv_list("p")] == ["second", "third", "first"]

    asyncio.run(go())


def test_kv_batch_get_gives_no_entry_for_keys_cleared_or_never_put(store: Path) -> None:
    async def go() -> None:
        async with Queue("kv_store", storage_path=str(store)) as q:
            kv = KVInterface(q)
            assert await kv.kv_batch_get(["nobody"], "p") == []  # nothing exists: []
            await kv.kv_batch_put(["a", "b", "c"], [{"v": 1}, {"v": 2}, {"v": 3}], "p")
            await kv.kv_clear(["a", "c"], "p")
            assert await kv.kv_batch_get(["a", "b", "c", "never"], "p") == [{"v": 2}]
            assert await kv.kv_batch_get(["a", "c"], "p") == []
            assert await kv.kv_batch_get(["a", "b"], "p", missing="none") == [None, {"v": 2}]
            with pytest.raises(KeyError, match=r"\['a', 'never'\]"):
                await kv.kv_batch_get(["a", "b", "never"], "p", missing="raise")

    asyncio.run(go())


RANK = {"task_name": "train", "partition_id": "step-0"}


def test_rank_aware_direct_call_hands_the_same_batch_again_whatever_is_ready() -> None:
    s = RankAwareSampler()
    first = s.sample([0, 1, 2, 3, 4, 5], 2, dp_rank=0, batch_index=0, **RANK)
    assert first == ([0, 1], [0, 1])
    # Another rank of data-parallel group 0 asks later: 0 and 1 are consumed by then, yet it gets the same batch.
    assert s.sample([2, 3, 4, 5], 2, dp_rank=0, batch_index=0, **RANK) == first
    assert s.sample(ready_indexes=[], batch_size=2, dp_rank=0, batch_index=0, **RANK) == first
    assert s.sample([2, 3, 4, 5], 2, dp_rank=1, batch_index=0, **RANK) == ([2, 3], [2, 3])  # another group
    assert s.sample([4, 5], 2, dp_rank=0, batch_index=1, **RANK) == ([4, 5], [4, 5])  # the next step
    assert s.sample([7, 8], 2, dp_rank=0, batch_index=0, task_name="ref", partition_id="step-0")[0] == [7, 8]
    assert s.sample([7, 8], 2, dp_rank=0, batch_index=0, task_name="train", partition_id="step-1")[0] == [7, 8]
    # fewer ready than batch_size: nothing, and nothing remembered (a later call takes a whole batch)
    assert s.sample([9], 2, dp_rank=2, batch_index=0, **RANK) == ([], [])
    assert s.sample([9, 10], 2, dp_rank=2, batch_index=0, **RANK) == ([9, 10], [9, 10])
    # what a caller does with its answer stays its own
    mine, _ = s.sample([], 2, dp_rank=0, batch_index=0, **RANK)
    mine.append(99)
    assert s.sample([], 2, dp_rank=0, batch_index=0, **RANK) == first
    s.clear_cache("step-0")
    assert s.sample([4, 5], 2, dp_rank=0, batch_index=0, **RANK) == ([4, 5], [4, 5])
    assert RankAwareSampler().sample([4, 5], 2, dp_rank=0, batch_index=0, **RANK) == ([4, 5], [4, 5])  # per object
    with pytest.raises(ConfigError, match="dp_rank"):
        s.sample([0, 1], 2, batch_index=0, **RANK)
    with pytest.raises(ConfigError, match="batch_index"):
        s.sample([0, 1], 2, dp_rank=0, batch_index=-1, **RANK)


def test_grpo_direct_call_groups_runs_of_n_consecutive_indexes() -> None:
    # the examples of TransferQueue 0.1.11's GRPOGroupNSampler (the seed's users' expectations)
    assert GRPOGroupNSampler(3).sample([0, 1, 3, 4, 5, 6, 7, 9, 10, 11], 6) == ([3, 4, 5, 9, 10, 11],) * 2
    assert GRPOGroupNSampler(2).sample([0, 1, 3, 4, 6, 7], 4) == ([0, 1, 3, 4],) * 2
    assert GRPOGroupNSampler(3).sample([0, 1, 3, 4, 6, 7], 6) == ([], [])  # no whole group: nothing
    assert GRPOGroupNSampler(2).sample([7, 6, 4, 3], 4) == ([3, 4, 6, 7],) * 2  # sorted first
    assert GRPOGroupNSampler(2).sample([0, 1, 3, 4], 6) == ([], [])  # a whole batch or nothing
    with pytest.raises(ConfigError, match="not a multiple"):
        GRPOGroupNSampler(2).sample([0, 1, 2], 3)
    # with dp_rank the answer is remembered, as RankAwareSampler's
    s = GRPOGroupNSampler(2)
    assert s.sample([4, 5, 6, 7], 2, dp_rank=0, batch_index=0, **RANK)[0] == [4, 5]
    assert s.sample([6, 7], 2, dp_rank=0, batch_index=0, **RANK)[0] == [4, 5]
    assert s.sample([6, 7], 2, dp_rank=1, batch_index=0, **RANK)[0] == [6, 7]


def test_get_meta_keeps_grouping_by_position_in_the_partition(store: Path) -> None:
    """The engine's grouping stays partition-relative: a partition starting at global index 1 (after another
    partition's one sample) hands out its groups [1, 2] and [3, 4]; grouping by index // n would split them."""
    with SyncQueue("g", storage_path=str(store)) as q:
        q.put({"x": [0]}, partition_id="other")
        q.put({"x": [1, 2, 3, 4]}, partition_id="p")
        meta = q.get_meta(["x"], 4, "train", "p", sampler=GRPOGroupNSampler(2))
        assert meta.global_indexes == [1, 2, 3, 4]
        q.put({"x": [5, 6]}, partition_id="p")
        r0 = q.get_meta(["x"], 2, "ranks", "p", sampler=RankAwareSampler(), dp_rank=0, batch_index=0)
        r0b = q.get_meta(["x"], 2, "ranks", "p", sampler=RankAwareSampler(), dp_rank=0, batch_index=0)
        assert r0.global_indexes == r0b.global_indexes == [1, 2]


_REFERENCE = """
import json, sys
from transfer_queue.sampler import GRPOGroupNSampler, RankAwareSampler
assert "site-packages" in sys.modules["transfer_queue"].__file__
calls, out = json.load(sys.stdin), []
rank = RankAwareSampler()
for kind, n, ready, batch, kw in calls:
    s = rank if kind == "rank" else GRPOGroupNSampler(n)
    out.append([list(x) for x in s.sample(ready, batch, **kw)])
print(json.dumps(out))
"""


def test_direct_calls_answer_as_transferqueue_does(seed: int) -> None:
    """Random direct calls, the same on persisting's samplers and TransferQueue 0.1.11's (run in a process of
    its own, where ``transfer_queue`` is the real package)."""
    rng = random.Random(seed)
    calls: list[list[Any]] = []
    for _ in range(200):
        ready = sorted(rng.sample(range(40), rng.randrange(0, 30)))
        if rng.random() < 0.5:
            n = rng.choice([1, 2, 3, 4])
            calls.append(["grpo", n, ready, n * rng.randrange(1, 4), {}])
        else:  # a few keys, so that many calls repeat one and read the remembered batch
            kw = {"dp_rank": rng.randrange(3), "batch_index": rng.randrange(3), **RANK}
            calls.append(["rank", 0, ready, rng.randrange(1, 6), kw])
    rank = RankAwareSampler()
    ours = []
    for kind, n, ready, batch, kw in calls:
        s = rank if kind == "rank" else GRPOGroupNSampler(n)
        ours.append([list(x) for x in s.sample(ready, batch, **kw)])
    # no PYTHONPATH: a shim that makes `transfer_queue` persisting's layer must not reach the reference
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if "No module named 'transfer_queue'" in done.stderr:
        pytest.skip("TransferQueue is not installed (the transferqueue extra)")
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for call, a, b in zip(calls, ours, theirs, strict=True):
        assert a == b, f"{call}: persisting {a}, TransferQueue {b}"
