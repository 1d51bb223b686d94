"""Samplers: their rules alone, through an embedded queue, through the broker, and several consumer processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import ConfigError, GRPOGroupNSampler, LengthBalancedSampler, Queue, RankAwareSampler, SequentialSampler

from .broker_fixture import BrokerProcess, make_broker

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
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = make_broker(tmp_path)
    b.extra_args = ["--arena-bytes", str(8 * 1024 * 1024)]
    try:
        b.start()
        yield b
        assert b.stop() == 0
    finally:
        b.ensure_dead()


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
