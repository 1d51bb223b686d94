"""The ``broker`` benchmark's 2x2 workload through the broker: 2 producer processes ``put_batch`` 100 records at a
time, 2 consumer processes split the index space in pages of one batch (consumer c reads pages c, c+2, ... with
``stream(wait=True)``), so every record is read exactly once; counts, duplicates, losses and per-producer order
are checked from the (index, id) pairs the consumers read."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.broker_process import cpu_seconds
from bench.common.measure import Tick
from bench.common.records import make_records
from bench.common.workers import (
    START_TIMEOUT_S,
    gather,
    guarded,
    join_all,
    queue_past_barrier,
    span,
    watch,
    worker,
    write_result,
)

PIPELINED_INFLIGHT = 4  # requests in flight per process in the pipelined runs
PUT_BATCH = 100  # records per put_batch in the throughput runs, and the consumers' page size
WAIT_TIMEOUT_S = 30.0  # a consumer waiting this long for its next page gives up (reported as lost records)


@dataclass(slots=True)
class Throughput:
    key: str
    label: str
    settings: str
    target: int  # records the producers set out to write
    produced: int = 0  # puts acknowledged to the producers
    consumed: int = 0  # records handed to consumers, duplicates included
    unique: int = 0  # distinct records consumed
    duplicates: int = 0  # consumed - unique
    lost: int = 0  # acknowledged, never consumed and not left in the queue
    left: int = 0  # still in the queue after the run (persist-queue: ready or un-acked rows)
    produce_s: float = 0.0  # earliest worker start -> last producer done
    consume_s: float = 0.0  # earliest worker start -> last record consumed
    broker_cpu_s: float | None = None
    clients_cpu_s: float | None = None  # the 4 workers' CPU seconds over their timed part
    order_ok: bool | None = None  # every producer's records in the order it wrote them (persisting only)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def produce_rate(self) -> float:
        return self.produced / self.produce_s if self.produce_s > 0 else 0.0

    @property
    def consume_rate(self) -> float:
        return self.unique / self.consume_s if self.consume_s > 0 else 0.0

    @property
    def cpu_us_per_record(self) -> float | None:
        """Broker + clients CPU per record moved: with ``cores`` cores, no run can move more than
        cores * 1e6 / this records per second (the CPU ceiling of the machine for this workload and code)."""
        if self.broker_cpu_s is None or self.clients_cpu_s is None or not self.unique:
            return None
        return (self.broker_cpu_s + self.clients_cpu_s) / self.unique * 1e6

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["produce_rec_per_s"] = self.produce_rate
        out["consume_rec_per_s"] = self.consume_rate
        out["cpu_us_per_record"] = self.cpu_us_per_record
        return out


def persisting_producer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    guarded(spec, info, lambda: asyncio.run(_persisting_producer(spec, info)))
    write_result(spec["out"], info)


async def _persisting_producer(spec: dict[str, Any], info: dict[str, Any]) -> None:
    count, batch, counter, inflight = spec["count"], spec["batch"], spec["counter"], spec["inflight"]
    records = make_records(count, spec["seed"], start=spec["index"] * count)
    async with queue_past_barrier(spec, info, durability=spec["durability"]) as q:
        # inflight > 1: that many put_batch requests in flight on the process's one connection (pipelined); the
        # broker assigns indexes in the order they arrive, so each producer's order holds.
        window: list[tuple[asyncio.Future[Any], int]] = []
        produced = 0
        for i in range(0, count, batch):
            chunk = records[i : i + batch]
            window.append((asyncio.ensure_future(q.put_batch(chunk)), len(chunk)))
            while window and (len(window) >= inflight or i + batch >= count):
                task, n = window.pop(0)
                await task
                produced += n
                info["produced"] = produced
                with counter.get_lock():
                    counter.value += n
        info["t1"] = time.monotonic()


def persisting_consumer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    pairs: list[tuple[int, int]] = []
    guarded(spec, info, lambda: asyncio.run(_persisting_consumer(spec, info, pairs)))
    write_result(spec["out"], info, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))


async def _persisting_consumer(spec: dict[str, Any], info: dict[str, Any], pairs: list[tuple[int, int]]) -> None:
    total, page, counter, inflight = spec["total"], spec["page"], spec["counter"], spec["inflight"]
    async with queue_past_barrier(spec, info, durability=spec["durability"], batch_size=page) as q:

        async def read_page(start: int) -> tuple[int, list[dict[str, Any]]]:
            got: list[dict[str, Any]] = []
            async for rows in q.stream(limit=min(page, total - start), offset=start, wait=True, timeout=WAIT_TIMEOUT_S):
                got.extend(rows)
            return start, got

        # inflight > 1: the next pages' reads are in flight (long-polls) while this one is handled
        starts = iter(range(spec["index"] * page, total, spec["consumers"] * page))
        window = [asyncio.ensure_future(read_page(s)) for s in itertools.islice(starts, inflight)]
        while window:
            start, rows = await window.pop(0)
            nxt = next(starts, None)
            if nxt is not None:
                window.append(asyncio.ensure_future(read_page(nxt)))
            pairs.extend((start + j, int(r["id"])) for j, r in enumerate(rows))
            with counter.get_lock():
                counter.value += len(rows)
            if len(rows) < min(page, total - start):
                info["error"] = f"no record at index {start + len(rows)} within {WAIT_TIMEOUT_S:g} s; gave up"
                for task in window:
                    task.cancel()
                break
        info["t1"] = time.monotonic()


def _persisting_row(durability: str, inflight: int, total: int) -> Throughput:
    suffix = "" if inflight == 1 else f"-pipelined-{inflight}"
    pipelined = "" if inflight == 1 else f"; {inflight} requests in flight per process (pipelined)"
    return Throughput(
        f"persisting-{durability}{suffix}",
        "persisting via broker",
        f'durability="{durability}"; 2 producers put_batch({PUT_BATCH}) of their own records; 2 consumers '
        f"split the index space in pages of {PUT_BATCH} (consumer c: pages c, c+2, ...) with "
        f"stream(wait=True){pipelined}; 4 spawned processes, one broker",
        total,
    )


def run_persisting_2x2(
    broker: str, broker_pid: int, durability: str, total: int, work: Path, seed: int, tick: Tick, inflight: int = 1
) -> Throughput:
    ctx = multiprocessing.get_context("spawn")
    producers, consumers = 2, 2
    per_producer = total // producers
    suffix = "" if inflight == 1 else f"-pipelined-{inflight}"
    topic = f"throughput-{durability}{suffix}"
    barrier = ctx.Barrier(producers + consumers + 1)
    counter = ctx.Value("q", 0)
    common = {"broker": broker, "topic": topic, "durability": durability, "barrier": barrier, "counter": counter}
    common["inflight"] = inflight
    procs = []
    for i in range(producers):
        spec = {**common, "index": i, "count": per_producer, "batch": PUT_BATCH, "seed": seed}
        spec["out"] = str(work / f"{topic}-producer-{i}")
        procs.append(worker(ctx, persisting_producer_main, spec, f"producer-{i}"))
    for i in range(consumers):
        spec = {**common, "index": i, "consumers": consumers, "total": total, "page": PUT_BATCH}
        spec["out"] = str(work / f"{topic}-consumer-{i}")
        procs.append(worker(ctx, persisting_consumer_main, spec, f"consumer-{i}"))
    row = _persisting_row(durability, inflight, total)
    for p in procs:
        p.start()
    cpu0 = None
    try:
        barrier.wait(START_TIMEOUT_S)
        cpu0 = cpu_seconds(broker_pid)
        watch(procs, counter, tick, timeout=600)
    except Exception as exc:  # a worker failed before the start: its result says why
        row.errors.append(f"start failed: {exc!r}")
    cpu1 = cpu_seconds(broker_pid)
    if cpu0 is not None and cpu1 is not None:
        row.broker_cpu_s = cpu1 - cpu0
    row.errors += join_all(procs, timeout=60)

    t0s, prod_t1, cons_t1 = [], [], []
    all_pairs = []
    for p, info, pairs in gather(procs, lambda p: work / f"{topic}-{p.name}", row.errors):
        if "t0" in info:
            t0s.append(info["t0"])
        if "cpu_s" in info:
            row.clients_cpu_s = (row.clients_cpu_s or 0.0) + float(info["cpu_s"])
        if p.name.startswith("producer"):
            row.produced += int(info.get("produced", 0))
            if "t1" in info:
                prod_t1.append(info["t1"])
        else:
            if "t1" in info:
                cons_t1.append(info["t1"])
            if pairs is not None:
                all_pairs.append(pairs)
    row.produce_s = span(t0s, prod_t1)
    row.consume_s = span(t0s, cons_t1)
    pairs = np.concatenate(all_pairs) if all_pairs else np.empty((0, 2), dtype=np.int64)
    _check_pairs(row, pairs, per_producer, producers)
    return row


def _check_pairs(row: Throughput, pairs: np.ndarray, per_producer: int, producers: int) -> None:
    """Count, duplicates and losses from the (global index, record id) pairs read; per-producer order."""
    row.consumed = len(pairs)
    ids = pairs[:, 1]
    uniq = np.unique(ids)
    row.unique = len(uniq)
    row.duplicates = row.consumed - row.unique
    expected = np.arange(producers * per_producer)
    row.lost = int(row.produced - np.isin(uniq, expected).sum())
    strays = int((~np.isin(uniq, expected)).sum())
    if strays:
        row.errors.append(f"{strays} record ids that no producer wrote")
    indexes = np.sort(pairs[:, 0])
    if len(indexes) and not np.array_equal(indexes, np.arange(len(indexes))):
        row.errors.append("the indexes read are not exactly 0..n-1")
    by_index = pairs[np.argsort(pairs[:, 0], kind="stable")]
    order_ok = True
    for p in range(producers):
        mine = by_index[(by_index[:, 1] >= p * per_producer) & (by_index[:, 1] < (p + 1) * per_producer), 1]
        order_ok &= bool(np.all(np.diff(mine) > 0))
    row.order_ok = order_ok
