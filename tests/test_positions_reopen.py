"""A sample's position in its partition (what samplers group by) is the same after a clear and a purge, a reopen
or a kill -9 of the broker as before it: the samplers hand out the same batches with and without the restart.

Issue 37: 6 prompts x 4 responses, group 0 taken, two responses of prompt 1 cleared; after a reopen every later
GRPO batch mixed two prompts, because the open rebuilt positions from the surviving rows only.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import GRPOGroupNSampler, LengthBalancedSampler, Queue, SequentialSampler
from persisting.client import _loop
from persisting.engine import partitions
from persisting.engine.fields import ANY
from persisting.engine.index import with_holes

from .broker_fixture import BrokerProcess

Batch = tuple[list[int], list[int]]  # (global indexes, their uids)

# The batches without a reopen: whole prompts 2..5 (prompt 1 lost two responses: never whole again).
EXPECTED = [(list(range(4 * u, 4 * u + 4)), [u] * 4) for u in range(2, 6)]


async def _before(q: Queue) -> list[int]:
    await q.put({"x": np.arange(24), "uid": np.repeat(np.arange(6), 4)}, partition_id="p")
    first = await q.get_meta(["x", "uid"], 4, "t", "p", GRPOGroupNSampler(4))
    assert await q.clear([5, 6], "p") == 2
    return first.global_indexes


async def _drain(q: Queue) -> list[Batch]:
    out: list[Batch] = []
    while True:
        data, meta = await q.get_batch(["x", "uid"], 4, "t", "p", GRPOGroupNSampler(4))
        if meta.size == 0:
            return out
        out.append((meta.global_indexes, [int(u) for u in data["uid"]]))


def test_grpo_groups_after_a_clear_and_a_reopen(store: Path) -> None:
    async def go() -> tuple[list[Batch], list[Batch], dict[str, Any], dict[str, Any]]:
        async with Queue("same", store / "same") as q:
            assert await _before(q) == [0, 1, 2, 3]
            same = await _drain(q)
            same_listing = await q.partitions()
        async with Queue("reopened", store / "reopened") as q:
            assert await _before(q) == [0, 1, 2, 3]
        async with Queue("reopened", store / "reopened") as q:  # the close purged the cleared rows
            reopened = await _drain(q)
            listing = await q.partitions()
        return same, reopened, same_listing, listing

    same, reopened, same_listing, listing = asyncio.run(go())
    print("without a reopen:", same, "\nwith a reopen:   ", reopened)
    assert same == EXPECTED
    assert reopened == same
    assert listing == same_listing
    assert listing["p"]["samples"] == 22 and listing["p"]["cleared"] == 2


def test_after_a_whole_partition_is_cleared_positions_go_on_counting(store: Path) -> None:
    """6 samples (not whole groups of 4) cleared, then 8 put: those are at positions 6..13, with or without a
    reopen between, so the one whole group is positions 8..11 (a reopen used to restart them at 0)."""

    async def go(reopen: bool) -> list[Batch]:
        path = store / str(reopen)
        q = Queue("c", path)
        await q.__aenter__()
        try:
            await q.put({"x": np.arange(6), "uid": [0] * 4 + [1] * 2}, partition_id="p")
            assert await q.clear(None, "p") == 6
            if reopen:  # the close purges the six rows: only the consumption log knows them
                await q.__aexit__(None, None, None)
                q = Queue("c", path)
                await q.__aenter__()
            await q.put({"x": np.arange(8), "uid": [1] * 2 + [2] * 4 + [3] * 2}, partition_id="p")
            return await _drain(q)
        finally:
            await q.__aexit__(None, None, None)

    for reopen in (False, True):
        assert asyncio.run(go(reopen)) == [([8, 9, 10, 11], [2, 2, 2, 2])], reopen


@pytest.mark.slow
def test_grpo_groups_after_a_clear_and_kill_9_of_the_broker(broker: BrokerProcess) -> None:
    async def before() -> list[Batch]:
        async with Queue("same", broker=broker.address, durability="process") as q:  # no restart in between
            assert await _before(q) == [0, 1, 2, 3]
            same = await _drain(q)
        async with Queue("g", broker=broker.address, durability="process") as q:
            assert await _before(q) == [0, 1, 2, 3]
        return same

    async def after() -> list[Batch]:
        async with Queue("g", broker=broker.address, durability="process") as q:
            return await _drain(q)

    same = asyncio.run(before())
    broker.kill()  # no purge at close: the restarted broker purges the cleared rows at open, before any read
    broker.start()
    batches = asyncio.run(after())
    print("without a restart:", same, "\nafter kill -9:    ", batches)
    assert same == EXPECTED
    assert batches == same


# -- seeded random runs: the same ops with and without a reopen give the same batches --------------------------


def _script(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    """Random ops over two partitions: puts of random sizes (not always whole groups), takes by the GRPO,
    length-balanced and sequential samplers, clears of random samples, of whole groups and of a whole partition."""
    ops: list[tuple[Any, ...]] = []
    for _ in range(rng.randrange(14, 22)):
        part = rng.choice("pq")
        kind = rng.choices(["put", "grpo", "lb", "seq", "clear", "flush"], [4, 3, 2, 1, 3, 1])[0]
        if kind == "flush":  # and purge: the running topic deletes cleared rows, not only the close
            ops.append(("flush", part))
        elif kind == "put":
            ops.append(("put", part, rng.choice([n, 2 * n, 3 * n, rng.randrange(1, 3 * n)])))
        elif kind == "grpo":
            ops.append(("grpo", part, n * rng.randrange(1, 4)))
        elif kind == "lb":
            ops.append(("lb", part))
        elif kind == "seq":
            ops.append(("seq", part, rng.randrange(1, 2 * n)))
        else:
            ops.append(("clear", part, rng.choices(["some", "group", "all"], [5, 3, 1])[0], rng.random()))
    return ops


async def _run(path: Path, ops: list[tuple[Any, ...]], n: int, reopen_at: int | None) -> list[Any]:
    """Run ``ops`` on a fresh topic (a close and an open before op ``reopen_at``); every answer, in order."""
    put = {"p": 0, "q": 0}  # samples ever put per partition: the next sample's position
    uids: dict[str, list[int]] = {"p": [], "q": []}  # per partition, the uid (position // n) of each sample
    gone: dict[str, set[int]] = {"p": set(), "q": set()}
    steps = {"p": 0, "q": 0}  # the next batch_index of the length-balanced task
    out: list[Any] = []
    q = Queue("r", path)
    await q.__aenter__()
    try:
        for k, op in enumerate([*ops, *[("drain", part) for part in "pq"]]):
            if k == reopen_at:
                await q.__aexit__(None, None, None)
                q = Queue("r", path)
                await q.__aenter__()
            kind, part = op[0], op[1]
            if kind == "flush":  # rows to Lance, then the purge the flush loop runs: cleared rows leave Lance now
                await q.flush()
                topic = q._handle.opened.engine_topic  # type: ignore[union-attr]
                await _loop.call(topic._clears.purge_now())
            elif kind == "put":
                first = put[part]
                ids = list(range(first, first + op[2]))
                data = {"uid": [p // n for p in ids], "len": [(p * 7919) % 97 for p in ids]}
                meta = await q.put(data, partition_id=part)
                uids[part].extend(meta.global_indexes)
                put[part] += op[2]
            elif kind == "clear":
                alive = [i for i in uids[part] if i not in gone[part]]
                if not alive:
                    continue
                if op[2] == "all":
                    await q.clear(None, part)
                    chosen = alive
                elif op[2] == "group":  # every sample of the group the first alive one is in
                    at = uids[part].index(alive[int(op[3] * len(alive))])
                    chosen = [i for p, i in enumerate(uids[part]) if p // n == at // n and i not in gone[part]]
                    await q.clear(chosen, part)
                else:
                    chosen = [i for i in alive if random.Random(op[3] * 1e6 + i).random() < 0.3]
                    await q.clear(chosen, part)
                gone[part].update(chosen)
                out.append(("clear", part, sorted(chosen)))
            elif kind in ("grpo", "drain"):
                size = op[2] if kind == "grpo" else n
                while True:
                    batch, meta = await q.get_batch(["uid"], size, "g", part, GRPOGroupNSampler(n))
                    got = [int(u) for u in batch["uid"]] if meta.size else []
                    out.append(("grpo", part, meta.global_indexes, got))
                    # whole groups only: n samples of one uid each
                    assert all(len(set(got[j : j + n])) == 1 for j in range(0, len(got), n)), (op, got)
                    if kind == "grpo" or meta.size == 0:
                        break
                if kind == "drain":
                    out.append(("seq", part, (await q.get_meta(["uid"], 10**6, "s", part)).global_indexes))
            elif kind == "lb":
                sampler = LengthBalancedSampler("len", dp_size=2, n_samples_per_prompt=n)
                step = steps[part]
                steps[part] += 1
                for rank in (0, 1):
                    meta = await q.get_meta(["uid"], n, "lb", part, sampler, dp_rank=rank, batch_index=step)
                    out.append(("lb", part, rank, meta.global_indexes))
            elif kind == "seq":
                meta = await q.get_meta(["uid"], op[2], "s", part, SequentialSampler())
                out.append(("seq", part, meta.global_indexes))
        # A task that took nothing is listed until a restart only (it has nothing in the log): not compared.
        listing = await q.partitions()
        for info in listing.values():
            info["tasks"] = {t: c for t, c in info["tasks"].items() if c != {"consumed": 0, "leased": 0}}
        out.append(("listing", listing))
    finally:
        await q.__aexit__(None, None, None)
    return out


def test_random_clears_and_a_reopen_hand_out_the_same_batches(
    store: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "PURGE_SPACING_SECONDS", 0.0)  # the flush loop purges as it goes, too
    rng = random.Random(seed)

    async def go() -> None:
        for round_ in range(5):
            n = rng.randrange(2, 5)
            ops = _script(rng, n)
            reopen_at = rng.randrange(len(ops) // 3, len(ops) + 2)  # after a few clears, up to before the last drain
            print(f"round {round_}: n={n}, {len(ops)} ops, reopen before op {reopen_at}: {ops}")
            same = await _run(store / f"same{round_}", ops, n, None)
            reopened = await _run(store / f"reopened{round_}", ops, n, reopen_at)
            for a, b in zip(same, reopened, strict=True):
                assert a == b, f"round {round_} (seed printed above): without a reopen {a}, with one {b}"

    asyncio.run(go())


def test_holes_keep_positions_and_field_steps() -> None:
    """The build's merge alone: purged cleared samples come back in index order, once; those at or above the
    backends' end (in the tail) and those still stored are not added again; a hole takes its neighbour's field set."""
    found = np.array([12, 10, 15, 16], dtype=np.int64)  # any order, as the buckets give them
    ids = np.array([3, 3, 4, 4], dtype=np.int64)
    indexes, set_ids = with_holes(found, ids, {9, 11, 13, 14, 15, 17, 30}, 20)
    assert indexes.tolist() == [9, 10, 11, 12, 13, 14, 15, 16, 17]
    assert set_ids.tolist() == [3, 3, 3, 3, 3, 3, 4, 4, 4]
    alone, alone_ids = with_holes(np.array([], dtype=np.int64), np.array([], dtype=np.int64), {4, 2, 3}, 10)
    assert alone.tolist() == [2, 3, 4] and alone_ids.tolist() == [ANY] * 3
