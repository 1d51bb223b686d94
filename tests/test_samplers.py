"""Samplers: their rules alone, through an embedded queue, through the broker, and several consumer processes."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import ConfigError, GRPOGroupNSampler, LengthBalancedSampler, Queue, RankAwareSampler, SequentialSampler
from persisting.engine import consumption

from .broker_fixture import BrokerProcess

WORKER = Path(__file__).with_name("arena_worker.py")


def test_grpo_takes_whole_groups_only() -> None:
    s = GRPOGroupNSampler(4)
    ready = list(range(100, 112))
    picked, consumed = s.sample(ready, 8, positions=list(range(12)))
    assert picked == consumed == list(range(100, 108))
    # positions 2..9 ready: group 0 (0-3) is not whole, group 1 (4-7) is, group 2 (8-11) is not
    picked, _ = s.sample(list(range(2, 10)), 8, positions=list(range(2, 10)))
    assert picked == [4, 5, 6, 7]
    with pytest.raises(ConfigError, match="not a multiple of n_samples_per_prompt=4"):
        s.sample(ready, 6, positions=list(range(12)))
    with pytest.raises(ConfigError, match="n_samples_per_prompt"):
        GRPOGroupNSampler(0)


def test_rank_aware_needs_its_keys() -> None:
    with pytest.raises(ConfigError, match="dp_rank"):
        RankAwareSampler().cache_key(batch_index=0)
    assert SequentialSampler().sample([3, 4, 5], 2) == ([3, 4], [3, 4])


class _Reverse:
    """A custom sampler: newest first."""

    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        picked = list(reversed(ready))[:batch_size]
        return picked, picked


class _Liar:
    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        return [10_000], [10_000]


async def _rules(q: Queue, custom: bool) -> None:
    await q.put({"x": np.arange(24)}, partition_id="p")  # 24 samples: 6 GRPO groups of 4
    # RankAware: ranks of one DP group (same dp_rank, batch_index) get the same batch; other dp_ranks disjoint
    r0a = await q.get_meta(["x"], 3, "train", "p", RankAwareSampler(), dp_rank=0, batch_index=0)
    r0b = await q.get_meta(["x"], 3, "train", "p", RankAwareSampler(), dp_rank=0, batch_index=0)
    r1 = await q.get_meta(["x"], 3, "train", "p", RankAwareSampler(), dp_rank=1, batch_index=0)
    r0next = await q.get_meta(["x"], 3, "train", "p", RankAwareSampler(), dp_rank=0, batch_index=1)
    assert r0a.global_indexes == r0b.global_indexes == [0, 1, 2]
    assert r1.global_indexes == [3, 4, 5] and r0next.global_indexes == [6, 7, 8]
    # GRPO on another task: whole groups, never one split across batches
    seen: list[list[int]] = []
    while True:
        meta = await q.get_meta(["x"], 8, "grpo", "p", GRPOGroupNSampler(4))
        if meta.size == 0:
            break
        seen.append(meta.global_indexes)
    assert seen == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
    with pytest.raises(ConfigError, match="multiple"):
        await q.get_meta(["x"], 6, "grpo2", "p", GRPOGroupNSampler(4))
    if custom:
        newest = await q.get_meta(["x"], 2, "rev", "p", _Reverse())
        assert newest.global_indexes == [23, 22]
        with pytest.raises(ConfigError, match="not ready"):
            await q.get_meta(["x"], 2, "liar", "p", _Liar())
    else:
        with pytest.raises(ConfigError, match="embedded mode only"):
            await q.get_meta(["x"], 2, "rev", "p", _Reverse())
    data, meta = await q.get_batch(["x"], 4, "batch", "p", GRPOGroupNSampler(4), wait=True, timeout=1)
    assert meta.global_indexes == [0, 1, 2, 3] and list(data["x"]) == [0, 1, 2, 3]


def test_sampler_rules_embedded(store: Path) -> None:
    async def go() -> None:
        async with Queue("s", store) as q:
            await _rules(q, custom=True)

    asyncio.run(go())


@pytest.fixture
def broker_args() -> list[str]:
    return ["--arena-bytes", str(8 * 1024 * 1024)]  # a small arena: these tests move little data


@pytest.mark.slow
def test_sampler_rules_through_the_broker(broker: BrokerProcess) -> None:
    async def go() -> None:
        async with Queue("s", broker=broker.address) as q:
            await _rules(q, custom=False)

    asyncio.run(go())


@pytest.mark.slow
def test_consumer_processes_of_one_task_never_share_a_sample(broker: BrokerProcess) -> None:
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), broker.address, "take", "many", "5"], stdout=subprocess.PIPE)
        for _ in range(3)
    ]

    async def produce() -> None:
        async with Queue("many", broker=broker.address) as q:
            for b in range(30):
                await q.put({"x": np.full((4, 8), b)}, partition_id="p")

    asyncio.run(produce())
    taken: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        for line in out.decode().splitlines():
            taken += [int(v) for v in line.split()[1:]]
    assert sorted(taken) == list(range(120))  # every sample once, none twice


async def _balanced(q: Queue) -> None:
    # 16 samples = 8 groups of 2; group g has length 10*g for both samples (sum 20*g)
    lengths = [10 * (i // 2) for i in range(16)]
    await q.put({"x": np.arange(16), "len": lengths}, partition_id="p")
    sampler = LengthBalancedSampler("len", dp_size=2, n_samples_per_prompt=2)
    r1 = await q.get_meta(["x"], 8, "train", "p", sampler, dp_rank=1, batch_index=0)
    r0 = await q.get_meta(["x"], 8, "train", "p", sampler, dp_rank=0, batch_index=0)
    assert sorted(r0.global_indexes + r1.global_indexes) == list(range(16))  # the whole step, split in two
    for meta in (r0, r1):
        idx = meta.global_indexes
        assert all(i % 2 == 0 and i + 1 in idx for i in idx if i % 2 == 0)  # whole groups
    sums = [sum(lengths[i] for i in m.global_indexes) for m in (r0, r1)]
    assert abs(sums[0] - sums[1]) <= 20  # 280 in all: 140 each, give or take one group step
    again = await q.get_meta(["x"], 8, "train", "p", sampler, dp_rank=0, batch_index=0)
    assert again.global_indexes == r0.global_indexes  # another rank of dp group 0 gets the same part
    with pytest.raises(ConfigError, match="dp_size"):
        await q.get_meta(["x"], 8, "train", "p", sampler, dp_rank=2, batch_index=1)


def test_length_balanced_embedded(store: Path) -> None:
    async def go() -> None:
        async with Queue("lb", store) as q:
            await _balanced(q)

    asyncio.run(go())


@pytest.mark.slow
def test_length_balanced_through_the_broker(broker: BrokerProcess) -> None:
    async def go() -> None:
        async with Queue("lb", broker=broker.address) as q:
            await _balanced(q)

    asyncio.run(go())


async def _answers_before(q: Queue) -> tuple[list[int], list[int]]:
    """Rank 0 of dp group 0 takes a RankAware batch; rank 1 of a LengthBalanced step takes its part (so dp_rank 0's
    part is only remembered)."""
    await q.put({"x": np.arange(16), "len": [10 * (i // 2) for i in range(16)]}, partition_id="p")
    ra = await q.get_meta(["x"], 4, "ra", "p", RankAwareSampler(), dp_rank=0, batch_index=0)
    sampler = LengthBalancedSampler("len", dp_size=2, n_samples_per_prompt=2)
    lb1 = await q.get_meta(["x"], 8, "lb", "p", sampler, dp_rank=1, batch_index=0)
    return ra.global_indexes, lb1.global_indexes


async def _answers_after(q: Queue, ra: list[int], lb1: list[int]) -> None:
    """After a restart: the other ranks of those steps get what they would have got without one."""
    again = await q.get_meta(["x"], 4, "ra", "p", RankAwareSampler(), dp_rank=0, batch_index=0)
    assert again.global_indexes == ra == [0, 1, 2, 3]
    other = await q.get_meta(["x"], 4, "ra", "p", RankAwareSampler(), dp_rank=1, batch_index=0)
    assert other.global_indexes == [4, 5, 6, 7]
    sampler = LengthBalancedSampler("len", dp_size=2, n_samples_per_prompt=2)
    lb0 = await q.get_meta(["x"], 8, "lb", "p", sampler, dp_rank=0, batch_index=0)
    assert sorted(lb0.global_indexes + lb1) == list(range(16))  # the rest of that step, nothing new taken
    assert (await q.get_meta(["x"], 8, "lb", "p", sampler, dp_rank=0, batch_index=1)).size == 0


def test_answers_for_other_ranks_survive_a_reopen(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        async with Queue("ans", store) as q:
            ra, lb1 = await _answers_before(q)
        monkeypatch.setattr(consumption, "COMPACT_AT_BYTES", 0)  # the reopen rewrites the log as a snapshot
        async with Queue("ans", store) as q:
            pass
        async with Queue("ans", store) as q:  # and this one reads that snapshot
            await _answers_after(q, ra, lb1)
            await q.reset_consumption("ra", "p")  # a reset forgets the task's answers too
            fresh = await q.get_meta(["x"], 4, "ra", "p", RankAwareSampler(), dp_rank=1, batch_index=0)
            assert fresh.global_indexes == [0, 1, 2, 3]

    asyncio.run(go())


@pytest.mark.slow
def test_answers_for_other_ranks_survive_kill_9_of_the_broker(broker: BrokerProcess) -> None:
    async def before() -> tuple[list[int], list[int]]:
        async with Queue("ans", broker=broker.address, durability="process") as q:
            return await _answers_before(q)

    ra, lb1 = asyncio.run(before())
    broker.kill()
    broker.start()

    async def after() -> None:
        async with Queue("ans", broker=broker.address, durability="process") as q:
            await _answers_after(q, ra, lb1)

    asyncio.run(after())


# -- windows: a built-in sampler sees only the front of the ready list; the answer must not change -------------


class _Pick:
    """A custom sampler handing out exactly ``picks`` (to lease a chosen pattern of samples)."""

    def __init__(self, picks: list[int]) -> None:
        self.picks = picks

    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        return list(self.picks), list(self.picks)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the engine's ready scans: stopped at a window, or over every ready sample."""
    from persisting.engine.takes import Takes

    counts = {"window": 0, "full": 0}
    original = Takes._ready_front

    def counting(*args: Any, **kwargs: Any) -> tuple[list[int], list[int], bool]:
        counts["full" if args[3] is None else "window"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(Takes, "_ready_front", staticmethod(counting))
    return counts


def _expected(sampler: Any, model: dict[str, Any], batch_size: int, kw: dict[str, int]) -> tuple[list[int], list[int]]:
    """What the sampler answers given every ready sample of the partition (the answer before windows)."""
    order: list[int] = model["indexes"]
    gone = model["done"] | model["leased"]
    positions = [p for p, i in enumerate(order) if i not in gone]
    ready = [order[p] for p in positions]
    extra = {"lengths": {i: model["lengths"][i] for i in ready}} if hasattr(sampler, "length_field") else {}
    result = sampler.sample(ready, batch_size, positions=positions, **extra, **kw)
    return result[0], result[1]


def test_a_window_gives_what_the_whole_ready_list_gives(store: Path, seed: int, scans: dict[str, int]) -> None:
    rng = random.Random(seed)

    async def go() -> None:
        async with Queue("win", store) as q:
            # Partitions whose puts interleave (global indexes have gaps) and come in sizes that are not multiples
            # of the group size (groups get cut), so that GRPO's front is not always whole.
            layouts: dict[str, list[int]] = {f"p{k}": [] for k in range(6)}
            lengths: dict[int, int] = {}
            put_sizes = [1, 2, 3, 4, 5, 8, 8, 8, 12, 16]
            while any(len(v) < 160 for v in layouts.values()):
                part = rng.choice([p for p, v in layouts.items() if len(v) < 160])
                size = rng.choice(put_sizes)
                lens = [rng.randrange(1, 1000) for _ in range(size)]
                meta = await q.put({"x": np.zeros(size), "len": lens}, partition_id=part)
                assert meta is not None
                layouts[part] += meta.global_indexes
                lengths.update(zip(meta.global_indexes, lens, strict=True))
            for case in range(40):
                part = rng.choice(list(layouts))
                task = f"t{case}"
                order = layouts[part]
                model: dict[str, Any] = {"indexes": order, "lengths": lengths, "done": set(), "leased": set()}
                # taken: a prefix (moves the floor), then random holes, some of them half groups
                cut = rng.randrange(0, len(order) // 2)
                done = set(order[:cut]) | {i for i in order[cut:] if rng.random() < rng.choice([0.0, 0.05, 0.3])}
                if done:
                    await q.mark_consumed(task, sorted(done), part)
                model["done"] = done
                leased = sorted(i for i in order if i not in done and rng.random() < rng.choice([0.0, 0.05, 0.2]))
                if leased:
                    got = await q.get_meta(["x"], len(leased), task, part, _Pick(leased), delivery="ack",
                                           lease_seconds=600)  # fmt: skip
                    assert got.global_indexes == leased
                model["leased"] = set(leased)
                n = rng.choice([1, 2, 4])
                sampler: Any
                kind = rng.choice(["sequential", "rank_aware", "grpo", "length_balanced"])
                if kind == "sequential":
                    sampler, batch, kw = SequentialSampler(), rng.randrange(0, 24), {}
                elif kind == "rank_aware":
                    sampler, batch, kw = RankAwareSampler(), rng.randrange(1, 24), {"dp_rank": 0, "batch_index": 0}
                elif kind == "grpo":
                    sampler, batch, kw = GRPOGroupNSampler(n), n * rng.randrange(1, 6), {}
                else:
                    dp = rng.randrange(1, 4)
                    sampler = LengthBalancedSampler("len", dp_size=dp, n_samples_per_prompt=n)
                    batch, kw = n * rng.randrange(1, 4), {"dp_rank": rng.randrange(dp), "batch_index": 0}
                for step in range(3):  # successive takes, each from what the previous ones left
                    if "batch_index" in kw:
                        kw = {**kw, "batch_index": step}
                    sampled, consumed = _expected(sampler, model, batch, kw)
                    meta = await q.get_meta(["x"], batch, task, part, sampler, **kw)
                    label = f"seed={seed} case={case} {kind} batch={batch} n={n} step={step}"
                    assert meta.global_indexes == sampled, label
                    model["done"] |= set(consumed)

    asyncio.run(go())
    assert scans["window"] > 0 and scans["full"] > 0, scans  # both paths ran: the front filled, and it did not


def test_a_big_backlog_still_hands_out_correct_batches(store: Path, scans: dict[str, int]) -> None:
    backlog = 40_000  # samples put, none taken: the front is what a take looks at

    async def go() -> None:
        async with Queue("big", store) as q:
            await q.put({"x": np.arange(backlog)}, partition_id="p")
            for i in range(0, 64, 8):  # every group's first sample taken: none of them whole any more
                await q.mark_consumed("broken", [i], "p")
            scans["window"] = scans["full"] = 0
            seq = [(await q.get_meta(["x"], 16, "seq", "p")).global_indexes for _ in range(3)]
            assert seq == [list(range(k, k + 16)) for k in (0, 16, 32)]
            grpo = [(await q.get_meta(["x"], 16, "grpo", "p", GRPOGroupNSampler(8))).global_indexes for _ in range(3)]
            assert grpo == [list(range(k, k + 16)) for k in (0, 16, 32)]
            assert scans == {"window": 6, "full": 0}  # the front made every batch: no scan of the backlog
            # Leased samples at the front are passed over; the batch comes from behind them.
            leased = await q.get_meta(["x"], 24, "ack", "p", GRPOGroupNSampler(8), delivery="ack", lease_seconds=600)
            after = await q.get_meta(["x"], 16, "ack", "p", GRPOGroupNSampler(8))
            assert leased.global_indexes == list(range(24)) and after.global_indexes == list(range(24, 40))
            # The first 8 groups are broken for this task: the window (40) holds no whole group, so the engine
            # asks again with every ready sample and still gets the first whole groups.
            broken = await q.get_meta(["x"], 16, "broken", "p", GRPOGroupNSampler(8))
            assert broken.global_indexes == list(range(64, 80))
            assert scans["full"] == 1
            # the last samples of the partition, after most of it was taken
            await q.mark_consumed("tail", list(range(backlog - 20)), "p")
            tail = await q.get_meta(["x"], 16, "tail", "p", GRPOGroupNSampler(8))
            assert tail.global_indexes == list(range(backlog - 16, backlog))

    asyncio.run(go())
