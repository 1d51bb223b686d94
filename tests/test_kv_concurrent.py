"""KVInterface writers in several processes never lose each other's acknowledged fields, tags or clears (issue 37).

Two and four processes (spawned, through a real broker) write disjoint fields of the same 40 keys at once after a
barrier: every key ends with every field and the last tag, every process reads the same values, and so does a
broker restarted on the same storage. A kv_clear racing puts of another process is never undone by a put that
carried only other fields: the expected outcome is defined by the log's order (a put landing after the clear starts
the key fresh, with only its fields). The same in one embedded process with two KVInterfaces, and the records of
earlier versions (whole values) still read as they did.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from pathlib import Path
from typing import Any

import pytest

from persisting import KVInterface, Queue

from .broker_fixture import BrokerProcess
from .kv_concurrent_worker import KEYS, PARTITION, writer

TIMEOUT_S = 60.0


def _writers(broker: BrokerProcess, topic: str, roles: list[tuple[str, str, bool, int]]) -> list[Any]:
    """Run one spawned writer per ``(role, field, tagged, seed)`` at once; their reads, in ``roles``' order."""
    ctx = multiprocessing.get_context("spawn")  # Lance is not fork-safe
    barriers = (ctx.Barrier(len(roles)), ctx.Barrier(len(roles)))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=writer, args=(broker.address, topic, role, field, tagged, seed, barriers, results))
        for role, field, tagged, seed in roles
    ]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in procs:
            field, values, listing = results.get(timeout=TIMEOUT_S)
            got[field] = (values, listing)
        for p in procs:
            p.join(TIMEOUT_S)
            assert p.exitcode == 0
        return [got[field] for _, field, _, _ in roles]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


async def _log(q: Queue) -> list[dict[str, Any]]:
    """Every record of the topic in global-index order (the order every process folds)."""
    out: list[dict[str, Any]] = []
    while True:
        rows, _end = await q._read(10_000, len(out))
        if not rows:
            return out
        out.extend(rows)


async def _state(q: Queue) -> tuple[list[Any], list[Any]]:
    kv = KVInterface(q)  # a fresh one: folds the whole log
    return await kv.kv_batch_get(KEYS, PARTITION, missing="none"), await kv.kv_list(PARTITION)


def _same_after_a_restart(broker: BrokerProcess, topic: str, before: tuple[list[Any], list[Any]]) -> None:
    broker.stop()
    broker.start()

    async def after() -> tuple[list[Any], list[Any]]:
        async with Queue(topic, broker=broker.address) as q:
            return await _state(q)

    assert asyncio.run(after()) == before


@pytest.mark.slow
def test_two_processes_keep_both_fields_and_the_last_tag(broker: BrokerProcess, seed: int) -> None:
    reads = _writers(broker, "kv2", [("put", "a", True, seed), ("put", "b", True, seed)])  # one order: they meet

    async def check() -> tuple[list[Any], list[Any]]:
        async with Queue("kv2", broker=broker.address) as q:
            values, listing = await _state(q)
            last_tag = {r["kv.key"]: r["kv.tag"] for r in await _log(q)}  # every put gave a tag: the last one's
        lost = [k for k, v in zip(KEYS, values, strict=True) if v != {"a": int(k[1:]), "b": int(k[1:])}]
        assert not lost, f"{len(lost)} of {len(KEYS)} keys lost a field: {lost[:5]}, e.g. {values[KEYS.index(lost[0])]}"
        assert sorted(listing) == sorted(last_tag.items())
        for values_seen, listing_seen in reads:  # every process folded the log to the same values and order
            assert (values_seen, listing_seen) == (values, listing)
        return values, listing

    before = asyncio.run(check())
    _same_after_a_restart(broker, "kv2", before)


@pytest.mark.slow
def test_four_processes_keep_every_field_and_a_tag_others_omit(broker: BrokerProcess, seed: int) -> None:
    """Only the writer of "a" gives tags: the others' puts keep the tag, whenever they land."""
    roles = [("put", field, field == "a", seed) for field in "abcd"]  # one order: they meet on each key
    reads = _writers(broker, "kv4", roles)

    async def check() -> None:
        async with Queue("kv4", broker=broker.address) as q:
            values, listing = await _state(q)
        want = [{f: int(k[1:]) for f in "abcd"} for k in KEYS]
        lost = [k for k, v, w in zip(KEYS, values, want, strict=True) if v != w]
        assert not lost, f"{len(lost)} of {len(KEYS)} keys lost a field: {lost[:5]}, e.g. {values[KEYS.index(lost[0])]}"
        assert sorted(listing) == sorted((k, f"a:{k}") for k in KEYS)
        assert all(read == (values, listing) for read in reads)

    asyncio.run(check())


@pytest.mark.slow
def test_a_clear_racing_puts_is_never_undone(broker: BrokerProcess, seed: int) -> None:
    """Every key holds {"a"} (tagged); then one process clears every key while another puts {"c"} on every key,
    untagged, in the same order. Where the put landed after the tombstone the key is {"c"} alone with no tag (a
    fresh value); where before, the key is gone."""

    async def setup() -> None:
        async with Queue("kvc", broker=broker.address) as q:
            await KVInterface(q).kv_batch_put(KEYS, [{"a": int(k[1:])} for k in KEYS], PARTITION, tags=KEYS)

    asyncio.run(setup())
    reads = _writers(broker, "kvc", [("clear", "x", False, seed), ("put", "c", False, seed)])

    async def check() -> tuple[list[Any], list[Any]]:
        async with Queue("kvc", broker=broker.address) as q:
            values, listing = await _state(q)
            log = await _log(q)
        last = {r["kv.key"]: (at, r) for at, r in enumerate(log)}  # each key's last record: tombstone or put
        want = [None if last[k][1].get("kv.deleted") else {"c": int(k[1:])} for k in KEYS]
        wrong = [(k, v) for k, v, w in zip(KEYS, values, want, strict=True) if v != w]
        assert not wrong, f"{len(wrong)} keys differ from the log's order: {wrong[:5]}"
        put_last = sorted((at, k) for k, (at, r) in last.items() if not r.get("kv.deleted"))
        assert listing == [(k, None) for _at, k in put_last]  # inserted anew where the put landed
        print(f"{sum(w is None for w in want)} keys cleared last, {sum(w is not None for w in want)} put last")
        assert all(read == (values, listing) for read in reads)
        return values, listing

    before = asyncio.run(check())
    _same_after_a_restart(broker, "kvc", before)


def test_two_kv_interfaces_in_one_process_keep_both_fields(store: Path, seed: int) -> None:
    """Embedded: two KVInterfaces on one Queue (each with its own folded copy), writing at once."""

    keys = list(KEYS)
    random.Random(seed).shuffle(keys)

    async def write(kv: KVInterface, field: str, start: asyncio.Barrier) -> None:
        for k in keys:
            await start.wait()  # both writers put each key at once
            await kv.kv_put(k, {field: int(k[1:])}, PARTITION, tag=f"{field}:{k}" if field == "a" else None)
            await kv.kv_batch_get([k], PARTITION)  # catch up in between, as a reading writer does

    async def go() -> tuple[list[Any], list[Any]]:
        async with Queue("kv", str(store)) as q:
            start = asyncio.Barrier(2)
            await asyncio.gather(write(KVInterface(q), "a", start), write(KVInterface(q), "b", start))
            values, listing = await _state(q)
        assert values == [{"a": int(k[1:]), "b": int(k[1:])} for k in KEYS]
        assert sorted(listing) == sorted((k, f"a:{k}") for k in KEYS)
        return values, listing

    before = asyncio.run(go())

    async def reopened() -> tuple[list[Any], list[Any]]:
        async with Queue("kv", str(store)) as q:
            return await _state(q)

    assert asyncio.run(reopened()) == before


def test_tags_omitted_clears_and_whole_values_of_earlier_versions(store: Path) -> None:
    """A tag omitted keeps the key's tag (a None given replaces it); a put after a clear starts fresh (its fields,
    its tag or None); the whole-value records earlier versions wrote read as they did, and fold with new puts."""

    def whole(key: str, tag: Any, **fields: Any) -> dict[str, Any]:  # what earlier versions appended on every put
        return {**fields, "kv.key": key, "kv.tag": tag, "kv.deleted": False, "kv.partition": "p"}

    async def go() -> None:
        async with Queue("kv", str(store)) as q:
            # An earlier version's log: x put twice (merged whole values), y put then cleared, z put once.
            await q.put_batch([whole("x", "t1", v=1, w="keep"), whole("y", None, v=2)], partition_id="p")
            await q.put_batch([whole("x", "t2", v=3, w="keep"), whole("z", "tz", v=4, s="old")], partition_id="p")
            await q.put_batch([{"kv.key": "y", "kv.tag": None, "kv.deleted": True, "kv.partition": "p"}], "p")
            kv = KVInterface(q)
            assert await kv.kv_batch_get(["x", "y", "z"], "p", missing="none") == [
                {"v": 3, "w": "keep"},
                None,
                {"v": 4, "s": "old"},
            ]
            assert await kv.kv_list("p") == [("x", "t2"), ("z", "tz")]
            await q.put_batch([whole("z", "tz2", v=5)], partition_id="p")  # a whole value replaces: s is gone
            await kv.kv_put("x", {"v": 6}, "p")  # tag omitted: t2 stays
            await kv.kv_batch_put(["z"], [{"u": 7}], "p", tags=[None])  # a None given replaces the tag
            await kv.kv_put("y", {"u": 8}, "p")  # after its clear: fresh, no tag
            assert await kv.kv_list("p") == [("x", "t2"), ("z", None), ("y", None)]
            await kv.kv_clear(["x"], "p")
            await kv.kv_put("x", {"u": 9}, "p")  # fresh: v and w and the tag are gone, and x comes last
            other = KVInterface(q)
            await other.kv_put("late", {"v": 10}, "p")  # kv has not read it yet, and clears it: it is cleared
            await kv.kv_clear(["late", "never-put"], "p")  # (a tombstone of a key never put is harmless)
        async with Queue("kv", str(store)) as q:
            kv = KVInterface(q)
            got = await kv.kv_batch_get(["x", "y", "z", "late", "never-put"], "p", missing="none")
            assert got == [{"u": 9}, {"u": 8}, {"v": 5, "u": 7}, None, None]
            assert await kv.kv_list("p") == [("z", None), ("y", None), ("x", None)]

    asyncio.run(go())
