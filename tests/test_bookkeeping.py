"""The run-length bookkeeping (runs.py) answers like plain sets and lists, and the engine's takes, leases, clears,
resets and restarts answer like a simple model that keeps every index (seed printed)."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import GRPOGroupNSampler, SequentialSampler
from persisting.engine import consumption
from persisting.engine.config import TopicConfig
from persisting.engine.layout import topic_dirname
from persisting.engine.runs import IndexRuns, PartitionIndex, Steps, expand, runs_of
from persisting.engine.topic import Topic
from persisting.storage import LanceBackend
from persisting.wire import codec


def test_runs_of_gives_the_values_back(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        n = rng.choice([0, 1, 2, 5, 63, 64, 65, 200])
        values = [rng.randrange(0, 50) for _ in range(n)] if rng.random() < 0.5 else list(range(7, 7 + n))
        runs = runs_of(values)
        assert expand(runs) == values
        assert all(count >= 1 for _first, count in runs)
        assert all(a + c != b for (a, c), (b, _d) in itertools.pairwise(runs))  # maximal runs


def test_index_runs_answer_like_a_set(seed: int) -> None:
    rng = random.Random(seed)
    runs, model = IndexRuns(), set()
    for step in range(2000):
        roll = rng.random()
        if roll < 0.4:
            lo = rng.randrange(0, 400)
            hi = lo + rng.randrange(0, 20)
            runs.add_range(lo, hi)
            model.update(range(lo, hi))
        elif roll < 0.6:
            lo = rng.randrange(0, 400)
            hi = lo + rng.randrange(0, 12)
            runs.discard_range(lo, hi)
            model.difference_update(range(lo, hi))
        elif roll < 0.7:
            gone = [rng.randrange(0, 400) for _ in range(rng.choice([1, 5]))]
            runs.discard(gone)
            model.difference_update(gone)
        else:
            values = [rng.randrange(0, 400) for _ in range(rng.choice([1, 3, 70]))]
            runs.update(np.asarray(values) if rng.random() < 0.2 else values)
            model.update(values)
        probe = rng.randrange(-2, 420)
        label = f"seed={seed} step={step}"
        assert (probe in runs) == (probe in model), label
        assert len(runs) == len(model) and list(runs) == sorted(model), label
        end = runs.end_of(probe)
        assert end == probe if probe not in model else (end not in model and set(range(probe, end)) <= model), label
        following = runs.next_start(probe)
        later = [v for v in model if v > probe and v - 1 not in model]
        assert following == (min(later) if later else None), label
        free, after = runs.gap(probe)
        assert free == end and free not in model and set(range(probe, free)) <= model, label
        starts = [v for v in model if v > free and v - 1 not in model]
        assert after == (min(starts) if starts else None), label
        assert runs.intervals() == [[lo, hi] for lo, hi in zip(runs.los, runs.his, strict=True)]
        assert all(hi < lo for hi, lo in zip(runs.his, runs.los[1:], strict=False)), label  # disjoint, not touching
    assert runs == model and IndexRuns.of(model) == runs


def test_partition_index_answers_like_a_list(seed: int) -> None:
    rng = random.Random(seed)
    index, model, nxt = PartitionIndex(), [], 0
    for step in range(400):
        nxt += rng.choice([0, 0, 1, 5])  # other partitions' puts in between, sometimes
        count = rng.choice([0, 1, 3, 8, 64])
        index.append(nxt, count)
        model.extend(range(nxt, nxt + count))
        nxt += count
        label = f"seed={seed} step={step}"
        assert len(index) == len(model) and list(index) == model, label
        assert PartitionIndex.of(model).to_list() == model, label
        probe = rng.randrange(0, nxt + 2)
        assert index.position(probe) == (model.index(probe) if probe in model else -1), label
        assert index.below(probe) == sum(1 for i in model if i < probe), label
        if model:
            p = rng.randrange(len(model))
            assert index.at(p) == model[p], label
            first, left = index.run_at(p)
            assert first == model[p] and model[p : p + left] == list(range(first, first + left)), label
            assert p + left == len(model) or model[p + left] != first + left, label
            lo, hi = sorted(rng.randrange(len(model) + 1) for _ in range(2))
            pieces = list(index.runs(lo, hi))
            assert [i for f, _p, c in pieces for i in range(f, f + c)] == model[lo:hi], label
            assert all(model[start] == f for f, start, _c in pieces), label


def test_steps_answer_like_a_list(seed: int) -> None:
    rng = random.Random(seed)
    steps, model = Steps(), []
    for _ in range(300):
        count, value = rng.choice([0, 1, 4, 30]), rng.choice([0, 1, 2])
        steps.append(count, value)
        model.extend([value] * count)
        if model:
            p = rng.randrange(len(model))
            assert steps[p] == model[p]
            lo, hi = sorted(rng.randrange(len(model) + 1) for _ in range(2))
            spans = list(steps.spans(lo, hi))
            assert [v for a, b, v in spans for _ in range(a, b)] == model[lo:hi]
    assert len(steps) == len(model)


# -- the engine against a model that keeps every index, as the engine did before runs ---------------------------


class Model:
    """Every index listed: partitions in order, per (partition, task) taken and leased sets, fields per sample."""

    def __init__(self) -> None:
        self.parts: dict[str, list[int]] = {}
        self.own: dict[int, set[str]] = {}
        self.done: dict[tuple[str, str], set[int]] = {}
        self.leased: dict[tuple[str, str], dict[int, bool]] = {}  # index -> the lease ends at the next take
        self.logged: set[tuple[str, str]] = set()  # (partition, task) with a take frame since its last reset
        self.cleared: set[int] = set()
        self.cleared_in: dict[str, set[int]] = {}  # per partition: samples ever cleared (kept across restarts)

    def ready(self, partition: str, task: str, fields: list[str] | None) -> tuple[list[int], list[int]]:
        key = (partition, task)
        leased = self.leased.setdefault(key, {})
        for index in [i for i, ends in leased.items() if ends]:
            del leased[index]
        gone = self.done.setdefault(key, set()) | set(leased) | self.cleared
        positions = [
            p
            for p, i in enumerate(self.parts.get(partition, []))
            if i not in gone and (not fields or set(fields) <= self.own[i])
        ]
        return [self.parts[partition][p] for p in positions], positions

    def restart(self) -> None:
        """A clean close purges the cleared rows from storage, but no position moves (a cleared sample stays a
        hole: issue 37, GRPO groups the same with and without a restart); leases end."""
        self.leased = {}
        self.done = {k: v for k, v in self.done.items() if k in self.logged}


async def _put(topic: Topic, rng: random.Random, model: Model, partition: str) -> None:
    n = rng.choice([1, 2, 3, 4, 8, 8, 16])
    mixed = rng.random() < 0.3
    rows = [{"a": k, "b": None if mixed and rng.random() < 0.5 else k} for k in range(n)]
    batch = codec.encode_batch(rows, topic.kinds)
    first, count = await topic.append(batch, partition, codec.pack(batch.rows))
    model.parts.setdefault(partition, []).extend(range(first, first + count))
    for k, row in enumerate(rows):
        model.own[first + k] = {name for name, v in row.items() if v is not None}


async def _patch(topic: Topic, rng: random.Random, model: Model, partition: str) -> None:
    targets = [i for i in model.parts.get(partition, []) if "b" not in model.own[i] and i not in model.cleared]
    if not targets:
        return
    chosen = rng.sample(targets, min(len(targets), rng.randrange(1, 4)))
    batch = codec.encode_batch([{"b": 1} for _ in chosen], topic.kinds)
    await topic.append(batch, partition, codec.pack(batch.rows), of=chosen)
    for i in chosen:
        model.own[i].add("b")


async def _take(topic: Topic, rng: random.Random, model: Model, partition: str, task: str, label: str) -> None:
    n = rng.choice([1, 2, 4])
    sampler: Any = GRPOGroupNSampler(n) if rng.random() < 0.5 else SequentialSampler()
    batch = n * rng.randrange(0, 5)
    fields = rng.choice([None, ["a"], ["b"], ["a", "b"]])
    lease = rng.choice([None, None, (600.0, None), (0.0, None)])
    ready, positions = model.ready(partition, task, fields)
    expected, consumed = sampler.sample(ready, batch, positions=positions)
    got = await topic.take(partition, task, batch, 0.0, sampler, lease, fields=fields, request_key=label)
    assert got == expected, f"{label} {type(sampler).__name__} batch={batch} fields={fields} lease={lease}"
    if lease is None:  # a re-sent take (same key) gets the same batch and takes nothing more
        assert await topic.take(partition, task, batch, 0.0, sampler, None, fields=fields, request_key=label) == got
    key = (partition, task)
    if lease is not None:
        model.leased.setdefault(key, {}).update(dict.fromkeys(consumed, lease[0] == 0.0))
    elif consumed:
        model.done.setdefault(key, set()).update(consumed)
        model.logged.add(key)


async def _check_partitions(topic: Topic, model: Model, label: str) -> None:
    listed = await topic.partitions()
    for partition, indexes in model.parts.items():
        entry = listed[partition]
        cleared = sum(1 for i in indexes if i in model.cleared)
        ever = len(model.cleared_in.get(partition, ()))
        assert (entry["samples"], entry["cleared"]) == (len(indexes) - cleared, ever), label
        for (where, task), taken in model.done.items():
            if where == partition and task in entry["tasks"]:
                leased = len(model.leased.get((where, task), {}))
                assert entry["tasks"][task] == {"consumed": len(taken - model.cleared), "leased": leased}, label


def test_takes_leases_clears_and_restarts_answer_like_the_model(store: Path, seed: int) -> None:
    rng = random.Random(seed)
    partitions, tasks = ["p", "q"], ["t", "u"]

    async def go() -> None:
        model = Model()
        topic = Topic("book", store, TopicConfig(batch_size=rng.choice([8, 64, 10**6])), LanceBackend)
        await topic.open()
        try:
            for step in range(400):
                label = f"seed={seed} step={step}"
                partition, task, roll = rng.choice(partitions), rng.choice(tasks), rng.random()
                if roll < 0.3:
                    await _put(topic, rng, model, partition)
                elif roll < 0.35:
                    await _patch(topic, rng, model, partition)
                elif roll < 0.75:
                    await _take(topic, rng, model, partition, task, label)
                elif roll < 0.82:
                    pool = [i for i in model.parts.get(partition, []) if i not in model.cleared]
                    chosen = rng.sample(pool, min(len(pool), rng.randrange(1, 12)))
                    if chosen:
                        await topic.mark_consumed(partition, task, chosen)
                        model.done.setdefault((partition, task), set()).update(chosen)
                        model.logged.add((partition, task))
                        for i in chosen:
                            model.leased.get((partition, task), {}).pop(i, None)
                elif roll < 0.88:
                    pool = model.parts.get(partition, [])
                    chosen = rng.sample(pool, min(len(pool), rng.randrange(1, 10)))
                    whole = rng.random() < 0.05
                    new = {i for i in (pool if whole else chosen) if i not in model.cleared}
                    assert await topic.clear(partition, None if whole else chosen) == len(new), label
                    model.cleared |= new
                    model.cleared_in.setdefault(partition, set()).update(new)
                    for (where, _t), leased in model.leased.items():
                        if where == partition:
                            for i in new:
                                leased.pop(i, None)
                elif roll < 0.92:
                    topic.reset_consumption(partition, task)
                    for table in (model.done, model.leased):
                        table.pop((partition, task), None)
                    model.logged.discard((partition, task))
                elif roll < 0.95:
                    await topic.close()
                    model.restart()
                    topic = Topic("book", store, topic.config, LanceBackend)
                    await topic.open()
                else:
                    await _check_partitions(topic, model, label)
        finally:
            await topic.close()

    asyncio.run(go())


def test_take_frames_of_the_old_form_are_still_read(store: Path) -> None:
    """Logs written before runs list every index ("take" frames): replay reads them, and a re-sent take's key
    still gets its batch."""

    async def go() -> None:
        topic = Topic("old", store, TopicConfig(), LanceBackend)
        await topic.open()
        batch = codec.encode_batch([{"a": k} for k in range(20)], topic.kinds)
        await topic.append(batch, "p", codec.pack(batch.rows))
        await topic.close()
        path = store / topic_dirname("old") / "consumption.log"
        with open(path, "ab") as f:
            f.write(consumption._frame(["take", "p", "t", [0, 1, 2, 5]]))
            f.write(consumption._frame(["take", "p", "t", [7, 6], [], ["key-1", [7, 6]]]))
        topic = Topic("old", store, TopicConfig(), LanceBackend)
        await topic.open()
        try:
            assert await topic.take("p", "t", 5, 0.0, request_key="key-1") == [7, 6]
            assert await topic.take("p", "t", 5, 0.0) == [3, 4, 8, 9, 10]
        finally:
            await topic.close()

    asyncio.run(go())


@pytest.mark.parametrize("compact", [False, True])
def test_take_runs_survive_a_reopen_and_compaction(store: Path, compact: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if compact:
        monkeypatch.setattr(consumption, "COMPACT_AT_BYTES", 1)

    async def go() -> None:
        topic = Topic("runs", store, TopicConfig(), LanceBackend)
        await topic.open()
        batch = codec.encode_batch([{"a": k} for k in range(40)], topic.kinds)
        await topic.append(batch, "p", codec.pack(batch.rows))
        assert await topic.take("p", "t", 8, 0.0, GRPOGroupNSampler(4), request_key="k") == list(range(8))
        await topic.mark_consumed("p", "t", [20, 9, 30, 31, 8])
        await topic.close()
        topic = Topic("runs", store, TopicConfig(), LanceBackend)
        await topic.open()
        try:
            assert await topic.take("p", "t", 8, 0.0, request_key="k") == list(range(8))  # the same batch
            assert await topic.take("p", "t", 6, 0.0) == [10, 11, 12, 13, 14, 15]
            listed = await topic.partitions()
            assert listed["p"]["tasks"]["t"]["consumed"] == 8 + 5 + 6
        finally:
            await topic.close()

    asyncio.run(go())
