"""Flush cost against stored data: one flush of 1,000 rows into an empty topic vs into a topic already holding
``prefill`` rows. Both topics are reopened with a ``batch_size`` too large to trigger background flushes, so
each timed ``flush()`` moves exactly one put_batch into Lance; the two topics alternate to share the noise."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common.measure import Tick, nearest_rank
from bench.common.records import PUT_BATCH, make_records
from persisting import Queue

NO_AUTO_FLUSH = 2**62  # batch_size: the engine flushes in the background once this many rows wait
PREFILL_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class FlushSeries:
    label: str
    stored_rows: int
    samples_s: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def p90_s(self) -> float:
        return nearest_rank(sorted(self.samples_s), 0.9)


@dataclass(frozen=True, slots=True)
class FlushResult:
    empty: FlushSeries
    full: FlushSeries
    prefill_s: float  # writing the prefill rows (durability="process", background flushes and compaction on)
    reopen_s: float  # opening the prefilled topic again (reads the index column of every bucket)

    @property
    def median_ratio(self) -> float:
        return self.full.median_s / self.empty.median_s

    @property
    def p90_ratio(self) -> float:
        return self.full.p90_s / self.empty.p90_s

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prefill_s": self.prefill_s, "reopen_s": self.reopen_s}
        for series in (self.empty, self.full):
            out[series.label] = {**asdict(series), "median_s": series.median_s, "p90_s": series.p90_s}
        out["median_ratio"] = self.median_ratio
        out["p90_ratio"] = self.p90_ratio
        return out


async def _prefill(path: Path, rows: int, seed: int, tick: Tick) -> None:
    q = Queue("full", path, durability="process")
    try:
        for start in range(0, rows, PREFILL_BATCH):
            batch = make_records(min(PREFILL_BATCH, rows - start), seed, start)
            await q.put_batch(batch)
            tick(len(batch))
        await q.flush()
    finally:
        await q.aclose()


async def _timed_flush(q: Queue, start: int, seed: int) -> float:
    await q.put_batch(make_records(PUT_BATCH, seed, start))
    t0 = time.perf_counter()
    await q.flush()
    return time.perf_counter() - t0


async def _measure(base: Path, prefill: int, reps: int, seed: int, tick: Tick) -> FlushResult:
    t0 = time.perf_counter()
    await _prefill(base / "full", prefill, seed, tick)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = await Queue("full", base / "full", batch_size=NO_AUTO_FLUSH).open()
    reopen_s = time.perf_counter() - t0
    empty = await Queue("empty", base / "empty", batch_size=NO_AUTO_FLUSH).open()
    next_id = {"empty": 0, "full": prefill}
    samples: dict[str, list[float]] = {"empty": [], "full": []}
    try:
        for rep in range(reps + 1):  # rep 0 warms up (and creates the empty topic's datasets): not counted
            order = [("empty", empty), ("full", full)]
            if rep % 2:
                order.reverse()
            for label, q in order:
                dt = await _timed_flush(q, next_id[label], seed)
                next_id[label] += PUT_BATCH
                if rep:
                    samples[label].append(dt)
            tick(2 * PUT_BATCH)
    finally:
        await empty.aclose()
        await full.aclose()
    return FlushResult(
        FlushSeries("empty", 0, samples["empty"]),
        FlushSeries("full", prefill, samples["full"]),
        prefill_s,
        reopen_s,
    )


def flush_cost(base: Path, prefill: int, reps: int, seed: int, tick: Tick) -> FlushResult:
    return asyncio.run(_measure(base, prefill, reps, seed, tick))
