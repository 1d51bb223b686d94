"""Shared memory as segments within a budget (issue 31), the hard way: a real broker subprocess with a small
first segment (4 MiB) and a budget of a few big batches, real files in /dev/shm, producers, consumers and the
broker SIGKILLed at awkward moments (random seeds printed: PERSISTING_TEST_SEED replays one).

A big batch (8-48 MiB) gets a segment of its own beyond the first (``broker/segments.py``: at least
``MIN_SEGMENT_BYTES``), goes through it as views, and the segment is given back once idle past the grace period
(0.5 s here, ``PERSISTING_SEGMENT_GRACE_S``) unless the pool keeps it: none here (``PERSISTING_SHM_POOL_SHARE``
0), but for the test of the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from persisting import BatchMeta, MemoryFull, SyncQueue
from persisting.client import tensor_puts
from persisting.client.connection import connection
from persisting.tensors.arena import HEADER_BYTES, default_path, leftover_segments, segment_path

from .broker_fixture import BrokerProcess, make_broker, running_broker
from .segment_worker import SAMPLE_BYTES, TOPIC, check, columns, mapped_files, mappings

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
ARENA_BYTES = 4 * MiB  # segment 0: smaller than every big batch here
SEGMENT_BYTES = 64 * MiB  # broker/segments.py MIN_SEGMENT_BYTES: each big batch here gets one of its own
BUDGET_BYTES = 192 * MiB  # room for the arena and two segments, plus 60 MiB
GRACE_S = 0.5
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The brokers these tests start inherit the environment: idle segments go after half a second, and no pool
    keeps them."""
    monkeypatch.setenv("PERSISTING_SEGMENT_GRACE_S", str(GRACE_S))
    monkeypatch.setenv("PERSISTING_SHM_POOL_SHARE", "0")


def _args(budget: int = BUDGET_BYTES) -> list[str]:
    return ["--arena-bytes", str(ARENA_BYTES), "--shm-budget", str(budget)]


def _stats(address: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        stats: dict[str, Any] = (await connection(address).request("hello", {})).result["arena_stats"]
        return stats

    return asyncio.run(go())


def _until(address: str, check_: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> dict[str, Any]:
    """The broker's arena stats once ``check_`` holds for them, or the last ones after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(address)
        if check_(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def _shm_files(storage: Path) -> list[Path]:
    """This broker's files in /dev/shm: segment 0 and every segment beyond it."""
    first = default_path(storage)
    return [p for p in [first, *leftover_segments(first)] if p.exists()]


def _stop_cleanly(b: BrokerProcess) -> None:
    """SIGTERM: the broker exits 0 and leaves nothing of its shared memory in /dev/shm (checked before the
    fixture's teardown, which removes whatever a killed broker left)."""
    assert b.stop() == 0, b.stderr[-2000:]
    assert _shm_files(b.storage) == [], "a clean stop left shared memory behind"


def _at_start(stats: dict[str, Any]) -> bool:
    """Budget accounting back to its start: segment 0 only, nothing leased or held."""
    return (
        stats["segments"] == 1
        and stats["segments_bytes"] == ARENA_BYTES
        and stats["leased_bytes"] == 0
        and stats["holds"] == 0
    )


class Worker:
    """A ``tests.segment_worker`` process; its stdout lines are read by a thread, so a silent worker fails the
    test after a timeout instead of blocking it."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.segment_worker", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []  # every line read so far
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.strip())
        self._queue.put(None)

    def line(self, word: str, timeout: float = 60.0) -> str:
        """The next line that starts with ``word`` (the ones before it are in ``lines`` too)."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(end - time.monotonic(), 0.001))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no {word!r} from the worker (exit {self.proc.poll()}): {self.lines}")
            self.lines.append(line)
            if line.startswith(word):
                return line

    def holding(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(self.line("HOLDING").split(" ", 1)[1])
        return report

    def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL, and wait until the kernel has reaped it (the broker's reaper sees it gone from then on)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def rest(self, timeout: float = 30.0) -> list[str]:
        """Wait for its exit; every line it printed."""
        self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return self.lines

    def done(self) -> int:
        """Close its stdin (a consumer then lets go of everything and exits); its exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@pytest.fixture
def workers() -> Iterator[Callable[..., Worker]]:
    """Starts worker processes; none is left running after the test, whatever happened."""
    started: list[Worker] = []

    def start(*args: str) -> Worker:
        started.append(Worker(*args))
        return started[-1]

    yield start
    for w in started:
        w.finish()


def _read_back(q: SyncQueue, samples_of: dict[int, int], task: str) -> dict[int, list[int]]:
    """Every sample of the partition, a batch at a time, checked byte for byte against ``batch(k)``: returns the
    global indexes of each batch (by seed). A batch there in part, or twice, fails here."""
    total = q.partitions().get("p", {}).get("samples", 0)
    meta = q.get_meta(["x", "k", "j"], total, task, "p")
    assert meta.size == total, f"{total - meta.size} of {total} samples are not readable (their tensors lost?)"
    plain = q.get_data(meta.select_fields(["k", "j"]))
    where: dict[int, list[int]] = {}
    for pos, k in enumerate(plain["k"]):
        where.setdefault(k, []).append(pos)
    seen = {}
    for k, positions in where.items():
        assert k in samples_of, f"a batch of seed {k} that nobody put"
        part = meta.select_samples(positions)
        data = q.get_data(part)
        assert list(data["j"]) == list(range(samples_of[k])), f"batch {k}: rows {list(data['j'])}, not once and whole"
        assert check(data), f"batch {k}: bytes differ"
        seen[k] = part.global_indexes
        del data
    return seen


def test_a_batch_larger_than_segment_0_grows_a_segment_and_is_read_as_views(
    tmp_path: Path, seed: int, workers: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (1): 32 MiB through a 4 MiB first segment: a new segment file, zero-copy both ways (a consumer in
    another process gets views mapped from that file), every byte as put. (7): nothing left at a clean stop."""
    _keep_unflushed(monkeypatch)  # the batch stays in its segment while the consumer starts
    samples = 32
    with running_broker(tmp_path, _args()) as b:
        before = _stats(b.address)
        assert before["segments"] == 1 and before["segments_bytes"] == ARENA_BYTES, before
        assert before["budget_bytes"] == BUDGET_BYTES, before
        first = default_path(b.storage)
        with SyncQueue(TOPIC, broker=b.address) as q:
            meta = q.put(columns(seed, samples), partition_id="p", timeout=10)
            moved = q.stats()["zerocopy"]
            assert moved["put_zero_copy_bytes"] == samples * SAMPLE_BYTES, moved
            assert moved["put_spooled_bytes"] == moved["put_copied_bytes"] == 0, moved
            stats = _stats(b.address)
            assert stats["segments"] == 2 and stats["segments_made"] == 1, stats
            assert stats["segments_bytes"] == ARENA_BYTES + SEGMENT_BYTES, stats
            assert stats["unpersisted_bytes"] == samples * SAMPLE_BYTES, stats
            assert leftover_segments(first) == [segment_path(first, 1)]

            consumer = workers("hold", b.address, str(samples))
            report = consumer.holding()
            assert report["n"] == samples and report["equal"], report
            assert report["files"] == [str(segment_path(first, 1))], report  # views of the new segment: no copy
            assert report["zero_copy"] == samples * SAMPLE_BYTES, report
            held = _stats(b.address)
            assert held["holds"] == 1 and held["held_extents"] == 1, held

            got = q.get_data(meta)  # and in this process too
            assert mapped_files([got["x"]]) == [str(segment_path(first, 1))]
            assert check(got)
            del got
            assert q.stats()["zerocopy"]["get_zero_copy_bytes"] == samples * SAMPLE_BYTES

            # two batches, two extents: one array of both needs a copy, and is counted as one
            meta2 = q.put(columns(seed + 1, samples), partition_id="p", timeout=10)
            before = q.stats()["zerocopy"]
            both = q.get_data(BatchMeta.concat([meta, meta2]))
            assert check(both) and mapped_files([both["x"]]) == [""], "two extents as one array, but no copy?"
            del both
            after = q.stats()["zerocopy"]
            assert after["get_copied_bytes"] - before["get_copied_bytes"] == 2 * samples * SAMPLE_BYTES, after
            assert after["get_zero_copy_bytes"] == before["get_zero_copy_bytes"], f"a copy counted as views: {after}"
        consumer.say("release")
        consumer.line("RELEASED")
        assert consumer.done() == 0
        _stop_cleanly(b)


@pytest.mark.parametrize("pooled", [False, True], ids=["no-pool", "pool-keeps-it"])
def test_an_idle_segment_is_given_back_after_its_grace(
    tmp_path: Path, seed: int, pooled: bool, workers: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (2): once the consumer released its views and the batch is flushed (not before), the segment file
    goes within a few seconds and the budget's accounting is back to its start; the producer, which mapped the
    segment to write into it, unmaps it at its next lease. With a pool (the default, half the budget) the segment
    is kept instead, for the next big batch, until a clean stop (7)."""
    _keep_unflushed(monkeypatch)  # flushed when the test says so
    if pooled:
        monkeypatch.delenv("PERSISTING_SHM_POOL_SHARE")
    samples = 32
    with running_broker(tmp_path, _args()) as b:
        first = default_path(b.storage)
        with SyncQueue(TOPIC, broker=b.address) as q:
            small = q.put(columns(seed + 2, 1), partition_id="small")  # in segment 0: read at the end
            q.put(columns(seed, samples), partition_id="p")
            if not pooled:
                time.sleep(GRACE_S + 1.5)  # the grace, and a reaper's round after it: not flushed, so not idle
                assert _stats(b.address)["segments"] == 2, "a segment went with a batch not flushed yet"
            consumer = workers("hold", b.address, str(samples))
            assert consumer.holding()["equal"]
            q.get_data(q.get_meta(["x"], samples, "here", "p")).release()  # this process read through it too
            q.flush()
            if not pooled:
                time.sleep(GRACE_S + 1.5)  # flushed, but held: not idle either
                held = _stats(b.address)
                assert held["segments"] == 2 and held["unpersisted_bytes"] == 0 and held["holds"] == 1, held
            consumer.say("release")
            consumer.line("RELEASED")
            if not pooled:
                stats = _until(b.address, lambda s: _at_start(s) and s["segments_given_back"] == 1)
                assert _at_start(stats), f"the idle segment was not given back: {stats}"
                free = ARENA_BYTES - HEADER_BYTES - SAMPLE_BYTES  # but the small batch, kept in segment 0
                assert stats["free_bytes"] == free and stats["segments_given_back"] == 1, stats
                assert _shm_files(b.storage) == [first], "the segment file is still in /dev/shm"
                # its memory is free only once no process maps it: the broker keeps no view of a batch it gave back
                broker_maps = Path(f"/proc/{b.proc.pid}/maps").read_text() if b.proc is not None else ""
                assert str(segment_path(first, 1)) not in broker_maps, "the broker still maps a given-back segment"
                assert str(segment_path(first, 1)) in _mapped_here()  # what this process wrote through
                assert str(segment_path(first, 1)) in _open_here()  # the descriptor views were mapped from
                q.get_data(small).release()  # a read prunes given-back segments (a consumer may never lease)
                assert str(segment_path(first, 1)) not in _open_here(), "a descriptor keeps a given-back segment alive"
                q.put(columns(seed + 1, 1), partition_id="small")  # (a lease prunes them too)
                assert str(segment_path(first, 1)) not in _mapped_here(), "the producer still maps a given-back segment"
            else:
                time.sleep(GRACE_S + 2.0)
                stats = _stats(b.address)
                assert stats["pool_bytes"] >= SEGMENT_BYTES and stats["holds"] == 0, stats
                assert stats["segments"] == 2 and stats["segments_given_back"] == 0, f"the pool let it go: {stats}"
                q.put(columns(seed + 1, samples), partition_id="p")  # into the pooled segment: none is made
                stats = _stats(b.address)
                assert stats["segments_made"] == 1 and stats["segments"] == 2, stats
                assert _shm_files(b.storage) == [first, segment_path(first, 1)]
        _stop_cleanly(b)


def test_the_grace_runs_from_when_a_segment_went_idle(
    tmp_path: Path, seed: int, workers: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (2): a segment is given back a grace period after it went idle (its last hold released, its batch
    flushed), not a grace period after its last lease or hold began: a consumer that held its views longer than
    the grace must not find the segment gone at once, or a stream whose consumers are slow makes a new segment
    for every batch (``broker/segments.py``: idle ──grace──▶ given back)."""
    _keep_unflushed(monkeypatch)
    grace = 2.0
    monkeypatch.setenv("PERSISTING_SEGMENT_GRACE_S", str(grace))
    with running_broker(tmp_path, _args()) as b:
        with SyncQueue(TOPIC, broker=b.address) as q:
            q.put(columns(seed, 32), partition_id="p")
            consumer = workers("hold", b.address, "32")
            assert consumer.holding()["equal"]
            q.flush()
            time.sleep(grace + 0.5)  # the consumer holds the views longer than the grace
            assert _stats(b.address)["segments"] == 2
            consumer.say("release")
            consumer.line("RELEASED")
            idle_since = time.monotonic()
            time.sleep(1.3)  # a reaper's round (each second) has run since the release
            assert _stats(b.address)["segments"] == 2, "the segment went at once, not a grace period after it was idle"
            stats = _until(b.address, _at_start)
            assert _at_start(stats), f"the idle segment was not given back: {stats}"
            assert time.monotonic() - idle_since >= grace - 0.2
        _stop_cleanly(b)


def test_a_full_budget_spills_a_put_to_disk_or_makes_it_wait(
    tmp_path: Path, seed: int, workers: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (3): with the whole budget held by consumers' views, a big put waits (backpressure) for
    ``SPILL_AFTER_SECONDS`` (1 s), then spills to a spool file, its bytes intact; the broker never makes a segment
    past the budget. With ``zerocopy_mode="force"`` it waits its whole timeout and raises ``MemoryFull`` (a
    ``Full``), storing nothing; a forced put that waits goes through as soon as a consumer lets go."""
    _keep_unflushed(monkeypatch)  # else both batches are flushed, idle and given back before the consumers come
    samples = 48  # a 64 MiB segment each: two fill the budget
    budget = ARENA_BYTES + 2 * SEGMENT_BYTES
    with running_broker(tmp_path, _args(budget)) as b:
        first = default_path(b.storage)
        with SyncQueue(TOPIC, broker=b.address) as q, SyncQueue(TOPIC, broker=b.address, zerocopy_mode="force") as fq:
            q.put(columns(seed, samples), partition_id="p")
            q.put(columns(seed + 1, samples), partition_id="p")
            # a consumer each (views of samples from two extents would be concatenated: a copy, no hold kept)
            consumers = [workers("hold", b.address, str(samples)) for _ in range(2)]
            reports = [c.holding() for c in consumers]
            assert all(r["equal"] for r in reports), reports
            assert sorted(f for r in reports for f in r["files"]) == [str(segment_path(first, i)) for i in (1, 2)]
            full = _stats(b.address)
            assert full["segments_bytes"] == full["budget_bytes"] == budget, full
            assert full["holds"] == full["held_extents"] == 2, full

            t0 = time.monotonic()
            q.put(columns(seed + 2, samples), partition_id="p", timeout=10)
            took = time.monotonic() - t0
            moved = q.stats()["zerocopy"]
            assert moved["put_spooled_bytes"] == samples * SAMPLE_BYTES, f"not spilled: {moved}"
            assert moved["put_zero_copy_bytes"] == 2 * samples * SAMPLE_BYTES, moved
            assert took >= 0.9, f"spilled after {took:.2f} s: without waiting for space first"
            after = _stats(b.address)
            assert after["segments"] == 3 and after["segments_bytes"] == budget, after
            assert after["leased_bytes"] == 0, after  # the lease it waited for left nothing behind

            t0 = time.monotonic()
            with pytest.raises(MemoryFull, match="budget"):
                fq.put(columns(seed + 3, samples), partition_id="p", timeout=2)
            assert time.monotonic() - t0 >= 1.9, "MemoryFull came without waiting for space"
            assert fq.stats()["zerocopy"]["put_spooled_bytes"] == 0
            assert _stats(b.address)["leased_bytes"] == 0

            result: list[Any] = []
            waiting = threading.Thread(
                target=lambda: result.append(fq.put(columns(seed + 4, samples), partition_id="p", timeout=30))
            )
            waiting.start()
            time.sleep(1.5)
            assert waiting.is_alive() and not result, "a forced put went through a full budget"
            consumers[0].say("release")
            consumers[0].line("RELEASED")
            waiting.join(timeout=30)
            assert result and result[0].size == samples, "the waiting put did not go through once space was free"
            assert fq.stats()["zerocopy"]["put_zero_copy_bytes"] == samples * SAMPLE_BYTES
            stats = _stats(b.address)
            assert stats["segments_bytes"] <= budget and stats["holds"] == 1, stats
            seen = _read_back(q, {seed + k: samples for k in (0, 1, 2, 4)}, "check")
            assert sorted(seen) == [seed, seed + 1, seed + 2, seed + 4], "the put that raised stored something"


@pytest.mark.parametrize("moment", ["random", "reserved"])
def test_a_producer_killed_mid_write_into_a_segment(
    tmp_path: Path, seed: int, moment: str, workers: Callable[..., Worker]
) -> None:
    """Issue 31 (4): a producer of 48 MiB batches SIGKILLed at a random moment of its puts (seeded), or while it
    writes into a reservation in a segment of its own: every acknowledged batch is there once and whole, nothing
    else is there in part, its lease goes back (the reaper, each second), and once idle the segments go too."""
    rng = random.Random(seed)
    samples, count = 48, 4 if moment == "random" else 2
    with running_broker(tmp_path, _args()) as b:
        first = default_path(b.storage)
        args = ["produce", b.address, str(samples), str(count), str(seed)]
        producer = workers(*args, *(["reserve"] if moment == "reserved" else []))
        if moment == "random":
            producer.line("WRITING 1")  # batch 0 acknowledged; batch 1 is being leased, written, put
            time.sleep(rng.uniform(0.0, 0.3))  # a put takes about 0.1-0.3 s here
        else:
            assert producer.line("RESERVED") == "RESERVED True"
            stats = _stats(b.address)
            assert stats["leased_bytes"] >= samples * SAMPLE_BYTES and stats["segments"] >= 2, stats
        producer.kill()
        lines = producer.rest()
        leased = _stats(b.address)["leased_bytes"]  # before the reaper's next round, most likely
        print(f"producer ({moment}): {lines}; {leased} bytes leased after the kill")
        acked = {int(w[1]): int(w[2]) for w in (line.split() for line in lines) if w[0] == "ACK"}
        assert seed in acked, lines
        stats = _until(b.address, lambda s: s["leased_bytes"] == 0)
        assert stats["leased_bytes"] == 0 and stats["leased_extents"] == 0, f"the dead producer's lease: {stats}"

        with SyncQueue(TOPIC, broker=b.address) as q:
            seen = _read_back(q, {seed + k: samples for k in range(count)}, "check")
            for k, first_index in acked.items():
                assert seen[k] == list(range(first_index, first_index + samples)), f"acknowledged batch {k}"
            q.flush()
        stats = _until(b.address, _at_start)
        assert _at_start(stats), f"the segments were not given back: {stats}"
        assert stats["segments_made"] >= 1 and stats["segments_given_back"] == stats["segments_made"], stats
        assert _shm_files(b.storage) == [first]
        _stop_cleanly(b)


def test_a_consumer_killed_holding_views_of_a_segment(
    tmp_path: Path, seed: int, workers: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (5): a consumer SIGKILLed while it holds views of a big batch's segment: its hold is dropped, the
    next big put reuses that segment (the budget has room for no other), and once idle it is given back."""
    _keep_unflushed(monkeypatch)  # the batch stays in its segment until the consumer holds it
    samples = 48
    with running_broker(tmp_path, _args(ARENA_BYTES + SEGMENT_BYTES)) as b:
        first = default_path(b.storage)
        with SyncQueue(TOPIC, broker=b.address) as q:
            q.put(columns(seed, samples), partition_id="p")
            consumer = workers("hold", b.address, str(samples))
            report = consumer.holding()
            assert report["equal"] and report["files"] == [str(segment_path(first, 1))], report
            assert _stats(b.address)["holds"] == 1
            consumer.kill()
            assert _until(b.address, lambda s: s["holds"] == 0)["holds"] == 0, "the dead consumer's hold stayed"
            q.put(columns(seed + 1, samples), partition_id="p", timeout=10)  # Full if the dead hold pinned it
            stats = _stats(b.address)
            assert stats["segments_made"] == 1 and stats["segments"] == 2, f"the segment was not reused: {stats}"
            _read_back(q, {seed: samples, seed + 1: samples}, "check")
            q.flush()
        stats = _until(b.address, _at_start)
        assert _at_start(stats) and stats["segments_given_back"] == 1, f"the segment was not given back: {stats}"
        assert _shm_files(b.storage) == [first]
        _stop_cleanly(b)


def test_a_broker_killed_with_unflushed_batches_in_segments_keeps_them(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (6): SIGKILL of the broker while acknowledged batches lie only in segments beyond the first (not
    yet in Lance): the restarted broker takes them from the files the killed one left, each batch once and every
    byte as put, and removes those files; it grows segments again; a clean stop leaves nothing in /dev/shm (7)."""
    _keep_unflushed(monkeypatch)
    rng = random.Random(seed)
    sizes = {seed + k: rng.randint(8, 40) for k in range(3)}  # 8-40 MiB each: 2 or 3 segments of the 256 MiB
    with running_broker(tmp_path, _args(4 * SEGMENT_BYTES)) as b:
        first = default_path(b.storage)
        with SyncQueue(TOPIC, broker=b.address) as q:
            for k, n in sizes.items():
                q.put(columns(k, n), partition_id="p")
        stats = _stats(b.address)
        # (an extent leased ahead for the next put may be larger than that put's batch)
        assert stats["sealed_extents"] == 3 and stats["cached_bytes"] == 0, f"flushed already: {stats}"
        assert stats["unpersisted_bytes"] >= sum(sizes.values()) * SAMPLE_BYTES, f"flushed already: {stats}"
        assert stats["segments"] >= 2, stats
        left = leftover_segments(first)
        assert left, "no segment beyond the first"
        b.kill()
        assert first.exists() and leftover_segments(first) == left, "the killed broker's files are not there"
        b.start()
        stats = _stats(b.address)
        assert stats["segments"] == 1 and stats["segments_made"] == 0, stats
        assert _shm_files(b.storage) == [first], "the restarted broker left the killed one's segments"
        with SyncQueue(TOPIC, broker=b.address) as q:
            seen = _read_back(q, sizes, "check")
            assert sorted(seen) == sorted(sizes), f"acknowledged batches lost: {sorted(sizes)} put, {sorted(seen)} seen"
            q.put(columns(seed + 10, 32), partition_id="p")  # segment 1 again: a new file of the new broker
            assert _stats(b.address)["segments_made"] == 1
            assert q.stats()["zerocopy"]["put_zero_copy_bytes"] == 32 * SAMPLE_BYTES
        _stop_cleanly(b)


def test_a_clean_stop_removes_every_segment_even_in_use(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (7): a broker stopped (SIGTERM) while its segments hold a batch this process has views of and a
    batch not flushed yet: it exits 0, flushes, and leaves no file in /dev/shm; the views stay readable (their
    pages live as long as this process maps them)."""
    _keep_unflushed(monkeypatch)
    with running_broker(tmp_path, _args()) as b:
        first = default_path(b.storage)
        with SyncQueue(TOPIC, broker=b.address) as q:
            meta = q.put(columns(seed, 32), partition_id="p")
            q.put(columns(seed + 1, 40), partition_id="p")
            got = q.get_data(meta)
        assert mapped_files([got["x"]]) == [str(segment_path(first, 1))]
        stats = _stats(b.address)
        assert stats["segments"] == 3 and stats["holds"] == 1 and stats["unpersisted_bytes"] > 0, stats
        _stop_cleanly(b)
        assert check(got), "views changed after the broker stopped"
        b.start()  # the batches were flushed at the stop
        with SyncQueue(TOPIC, broker=b.address) as q:
            _read_back(q, {seed: 32, seed + 1: 40}, "check")
        _stop_cleanly(b)


def _keep_unflushed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Brokers started from now on write arena batches behind by ten minutes: flushed only by ``flush()``, a
    clean stop or memory pressure (persisting/engine/flushing.py)."""
    monkeypatch.setenv("PERSISTING_WRITE_BEHIND_IDLE", "600")
    monkeypatch.setenv("PERSISTING_WRITE_BEHIND_MAX", "600")


def _open_here() -> set[str]:
    """The files this process holds open now (an unlinked one by its name): an open tmpfs file keeps its memory."""
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            out.add(os.readlink(fd).removesuffix(" (deleted)"))
    return out


def _mapped_here() -> set[str]:
    """The files this process maps now (an unlinked one by its name)."""
    return {name for _lo, _hi, name in mappings()}


def _file_size_limit(nbytes: int) -> Callable[[], None]:
    def limit() -> None:  # in the broker's process only: a segment file larger than this fails its fallocate (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return limit


def test_a_segment_the_machine_cannot_give_is_memory_pressure(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 (1, 3): /dev/shm may hold less than the budget said at start (others filled it since): a segment
    whose fallocate fails is no room, as a full budget is, so the put spills to disk (or waits, then MemoryFull),
    the broker logs it once and goes on; never a failed put or a dead broker. The broker's files may not exceed
    48 MiB here (RLIMIT_FSIZE: the fallocate of a 64 MiB segment fails as on a short /dev/shm)."""
    monkeypatch.setattr(tensor_puts, "SPILL_AFTER_SECONDS", 0.3)
    b = make_broker(tmp_path)
    b.extra_args, b.preexec, b.log_path = _args(), _file_size_limit(48 * MiB), tmp_path / "broker.log"
    try:
        b.start()
        with SyncQueue(TOPIC, broker=b.address) as q:
            meta = q.put(columns(seed, 32), partition_id="p")  # 32 MiB: a segment of 64 MiB, refused by the kernel
            moved = q.stats()["zerocopy"]
            assert moved["put_spooled_bytes"] == 32 * SAMPLE_BYTES and moved["put_zero_copy_bytes"] == 0, moved
            assert check(q.get_data(meta))
            assert _stats(b.address)["segments"] == 1
            with pytest.raises(MemoryFull):  # shared memory or nothing: it waits, then says so
                SyncQueue(TOPIC, broker=b.address, zerocopy_mode="force").put(columns(seed, 32), "p", timeout=1.0)
            q.put(columns(seed + 1, 1), partition_id="small")  # segment 0 still takes what fits
        assert b.stop() == 0
        assert (tmp_path / "broker.log").read_text().count("no new shared-memory segment") == 1  # not a flood
    finally:
        b.ensure_dead()
