"""The ``samples`` benchmark: ``get_meta`` (consume-on-fetch sample hand-out with ``GRPOGroupNSampler``) through
the broker, 2 producer processes and 4 consumer processes of one task, against the protocol's ``hello`` round
trip (the floor of any request) in the same run.

One broker (a subprocess on fresh temp storage, an ipc socket under /tmp, ``--log-level WARNING``). Every worker
is a ``spawn``-ed process (Lance is not fork-safe) that opens its queue, then waits on one barrier, so start-up is
never timed; ``time.monotonic`` is one clock for all processes on Linux.

1. Reference, in this process before the workload, broker idle: ``hello`` via
   ``persisting.client.connection.connection(address).request("hello", {})`` (envelope, dispatch, reply; no topic, no
   storage), and ``get_meta`` of 16 samples (2 groups) with samples ready (its own topic, kept at a backlog of
   64-128 untaken samples by untimed 64-sample puts; ``wait=False``), the two series interleaved in rounds so they
   share the machine's noise; then ``get_meta`` on a topic prefilled with a backlog of 32,768 untaken samples
   (100 calls), to show what a backlog costs each call.
2. Workload, topic ``samples`` (fresh): 2 producers each ``put`` P tensor batches of 64 samples
   (``{"x": float32[64, 16], "len": 64 ints}``, 8 GRPO groups of n=8, ``durability="process"``) as fast as they
   can (or one put per ``--put-interval-ms``); 4 consumers of task ``train`` call ``get_meta(["x"], 16,
   "train", "p", sampler=GRPOGroupNSampler(8), wait=True, timeout=...)`` until every sample is taken. Per call
   latency is kept for calls that returned samples; it includes waiting in the broker for a put when the
   consumers are ahead of the producers. The backlog (samples put, not yet taken) is sampled every 50 ms by this
   process, which also times a ``hello`` round trip every 10 ms (the floor of a request on the loaded machine);
   each process's CPU time until every sample is taken is kept (``time.process_time`` in the workers,
   ``/proc/<pid>/stat`` for the broker), to tell the take's own work from waiting for a core or for the broker.
   Checks: every global index 0..N-1 taken exactly once across the 4 consumers, nothing else taken, and every
   returned batch made of whole groups (runs of 8 indexes [8k, 8k+8), in order).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.common.broker_process import broker_process, cpu_seconds, log_lines
from bench.common.measure import Tick
from bench.common.workers import (
    START_TIMEOUT_S,
    gather,
    guarded,
    join_each,
    queue_past_barrier,
    span,
    worker,
    write_result,
)
from bench.samples.floor import round_trips_per_s
from bench.samples.result import (
    BACKLOG,
    BACKLOG_CALLS,
    BACKLOG_EVERY_S,
    CASE_LIMIT_S,
    CONSUMERS,
    FEATURES,
    FRESH_HELLOS,
    GET_TIMEOUT_S,
    GROUP_N,
    LATENCY_ROUNDS,
    PROBE_INTERVAL_S,
    PRODUCERS,
    PUT_ROWS,
    TAKE,
    SamplesBenchResult,
    whole_groups,
)
from bench.samples.transferqueue_peer import run_tq_reference
from persisting import GRPOGroupNSampler, Queue
from persisting.client.connection import connection

# -- 1. reference: hello and get_meta on an idle broker -----------------------------------------------------


async def _reference(broker: str, n: int, warmup: int, result: SamplesBenchResult, tick: Tick) -> None:
    conn = connection(broker)
    q = Queue("samples-idle", broker=broker, durability="process")
    qb = Queue("samples-backlog", broker=broker, durability="process")
    await q.open()
    await qb.open()
    sampler = GRPOGroupNSampler(GROUP_N)
    x = np.zeros((PUT_ROWS, FEATURES), np.float32)
    lens = list(range(PUT_ROWS))
    left = [0]  # untaken samples of the idle topic
    try:

        async def hello() -> int:
            await conn.request("hello", {})
            return 1

        async def get_meta() -> int:
            while left[0] < 2 * PUT_ROWS:  # untimed refill: keep the backlog at 64-128 samples
                await q.put({"x": x, "len": lens}, partition_id="p")
                left[0] += PUT_ROWS
            t0 = time.perf_counter_ns()
            meta = await q.get_meta(["x"], TAKE, "train", "p", sampler=sampler)
            left[0] -= len(meta)
            return -(time.perf_counter_ns() - t0) if len(meta) else 0  # negative: its own timing (ns)

        for k in range(warmup + FRESH_HELLOS):  # before any put: no arena extents for hello's arena_stats to count
            t0 = time.perf_counter_ns()
            await hello()
            if k >= warmup:
                result.hello_fresh.samples_us.append((time.perf_counter_ns() - t0) / 1e3)
        plan = [(result.hello, hello), (result.idle, get_meta)]
        for _series, fn in plan:
            for _ in range(warmup):
                await fn()
        tick(2 * warmup)
        per_round = math.ceil(n / LATENCY_ROUNDS)
        for start in range(0, n, per_round):
            stop = min(n, start + per_round)
            for series, fn in plan:
                for _ in range(start, stop):
                    t0 = time.perf_counter_ns()
                    got = await fn()
                    dt = (time.perf_counter_ns() - t0) / 1e3 if got > 0 else -got / 1e3
                    if got:
                        series.samples_us.append(dt)
                    else:
                        result.errors.append(f"{series.key}: an idle get_meta returned no samples")
                tick(stop - start)
        for _ in range(BACKLOG // PUT_ROWS):
            await qb.put({"x": x, "len": lens}, partition_id="p")
        for _ in range(BACKLOG_CALLS):
            t0 = time.perf_counter_ns()
            meta = await qb.get_meta(["x"], TAKE, "train", "p", sampler=sampler)
            result.backlog.samples_us.append((time.perf_counter_ns() - t0) / 1e3)
            if len(meta) != TAKE:
                result.errors.append(f"backlog get_meta returned {len(meta)} samples, expected {TAKE}")
        tick(BACKLOG_CALLS)
    finally:
        await q.aclose()
        await qb.aclose()


# -- 2. workload: 2 producers, 4 consumers ------------------------------------------------------------------


def producer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    guarded(spec, info, lambda: asyncio.run(_producer(spec, info)), BaseException)
    write_result(spec["out"], info)


async def _producer(spec: dict[str, Any], info: dict[str, Any]) -> None:
    rng = np.random.default_rng(spec["seed"] + spec["index"])
    pool = [rng.standard_normal((PUT_ROWS, FEATURES), dtype=np.float32) for _ in range(4)]
    lens = [int(v) for v in rng.integers(1, 4096, PUT_ROWS)]
    async with queue_past_barrier(spec, info, durability="process") as q:
        cpu0 = time.process_time()
        interval = spec["put_interval_s"]
        for i in range(spec["puts"]):
            if interval > 0:
                await asyncio.sleep(max(0.0, info["t0"] + i * interval - time.monotonic()))
            await q.put({"x": pool[i % len(pool)], "len": lens}, partition_id="p")
            info["produced"] = (i + 1) * PUT_ROWS
            with spec["put_count"].get_lock():
                spec["put_count"].value += PUT_ROWS
        info["t1"] = time.monotonic()
        info["cpu_s"] = time.process_time() - cpu0


def consumer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {"lat_us": [], "batches": [], "calls": 0, "empty": 0}
    guarded(spec, info, lambda: asyncio.run(_consumer(spec, info)), BaseException)
    write_result(spec["out"], info)


async def _consumer(spec: dict[str, Any], info: dict[str, Any]) -> None:
    total, taken, producers_done = spec["total"], spec["taken"], spec["producers_done"]
    sampler = GRPOGroupNSampler(GROUP_N)
    async with queue_past_barrier(spec, info, durability="process") as q:
        cpu0 = time.process_time()
        deadline = time.monotonic() + CASE_LIMIT_S
        while time.monotonic() < deadline:
            t0 = time.perf_counter_ns()
            meta = await q.get_meta(["x"], TAKE, "train", "p", sampler=sampler, wait=True, timeout=spec["get_timeout"])
            dt = (time.perf_counter_ns() - t0) / 1e3
            info["calls"] += 1
            if len(meta):
                info["t1"] = time.monotonic()
                info["cpu_s"] = time.process_time() - cpu0  # up to its last batch: not the idle wait at the end
                info["lat_us"].append(dt)
                info["batches"].append(meta.global_indexes)
                with taken.get_lock():
                    taken.value += len(meta)
                continue
            info["empty"] += 1
            # Puts are visible once they returned: with the producers done, an empty answer means all taken.
            if taken.value >= total or producers_done.is_set():
                return
        info["error"] = f"not done within {CASE_LIMIT_S:g} s"


@dataclass(slots=True)
class _Shared:
    """What the bench process shares with the workload's processes: the start barrier, the counters, the signal
    that every producer is done."""

    barrier: Any
    taken: Any
    put_count: Any
    producers_done: Any


def _workload(
    broker: str,
    broker_pid: int | None,
    work: Path,
    puts: int,
    put_interval_s: float,
    get_timeout: float,
    seed: int,
    result: SamplesBenchResult,
    tick: Tick,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    total = PRODUCERS * puts * PUT_ROWS
    result.total = total
    shared = _Shared(ctx.Barrier(PRODUCERS + CONSUMERS + 1), ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event())
    common = {"broker": broker, "topic": "samples", "barrier": shared.barrier, "seed": seed}

    def spawn(role: str, target: Any, i: int, **spec: Any) -> Any:
        name = f"{role}-{i}"
        return worker(ctx, target, {**common, "index": i, **spec, "out": str(work / name)}, name, daemon=True)

    prods = [
        spawn("producer", producer_main, i, puts=puts, put_interval_s=put_interval_s, put_count=shared.put_count)
        for i in range(PRODUCERS)
    ]
    cons = [
        spawn("consumer", consumer_main, i, total=total, taken=shared.taken, producers_done=shared.producers_done,
              get_timeout=get_timeout)
        for i in range(CONSUMERS)
    ]  # fmt: skip
    for p in [*prods, *cons]:
        p.start()
    seen = 0
    try:
        seen = asyncio.run(_monitor(broker, broker_pid, shared, prods, cons, result, tick))
    except Exception as exc:
        result.errors.append(f"start failed: {exc!r}")
    shared.producers_done.set()
    result.errors += join_each([*prods, *cons], 10)
    tick(shared.taken.value - seen)
    _collect(prods, cons, work, result)


async def _monitor(
    broker: str, broker_pid: int | None, shared: _Shared, prods: list[Any], cons: list[Any], result: SamplesBenchResult,
    tick: Tick,
) -> int:  # fmt: skip
    """While the consumers run: a hello every ``PROBE_INTERVAL_S`` (timed), the backlog every
    ``BACKLOG_EVERY_S``, the CPU times once every sample is taken. Returns the samples it ticked."""
    cpu0 = time.process_time()
    conn = connection(broker)
    await conn.request("hello", {})  # connected before the clock starts
    shared.barrier.wait(START_TIMEOUT_S)
    t_start, broker_cpu0 = time.monotonic(), cpu_seconds(broker_pid)
    deadline = t_start + CASE_LIMIT_S + 10
    next_backlog, seen = t_start, 0
    while any(p.is_alive() for p in cons) and time.monotonic() < deadline:
        if not shared.producers_done.is_set() and not any(p.is_alive() for p in prods):
            shared.producers_done.set()
        if not result.workload_s and shared.taken.value >= result.total:  # the busy part is over (consumers idle)
            result.workload_s = time.monotonic() - t_start
            broker_cpu1 = cpu_seconds(broker_pid)
            if broker_cpu0 is not None and broker_cpu1 is not None:
                result.cpu_s["broker"] = broker_cpu1 - broker_cpu0
            result.cpu_s["bench process"] = time.process_time() - cpu0
        t0 = time.perf_counter_ns()
        await conn.request("hello", {})
        result.hello_live.samples_us.append((time.perf_counter_ns() - t0) / 1e3)
        if time.monotonic() >= next_backlog:
            got = shared.taken.value
            result.max_backlog = max(result.max_backlog, shared.put_count.value - got)
            tick(got - seen)
            seen = got
            next_backlog += BACKLOG_EVERY_S
        await asyncio.sleep(PROBE_INTERVAL_S)
    return seen


def _collect(prods: list[Any], cons: list[Any], work: Path, result: SamplesBenchResult) -> None:
    """The workers' result files into ``result``: CPU, counts, latencies, and the check of every index taken."""
    t0s: list[float] = []
    prod_t1: list[float] = []
    take_t1: list[float] = []
    every: list[int] = []
    for p, info, _ in gather([*prods, *cons], lambda p: work / p.name, result.errors, "no result file"):
        if "t0" in info:
            t0s.append(info["t0"])
        role = "producers" if p in prods else "consumers"
        result.cpu_s[role] = result.cpu_s.get(role, 0.0) + float(info.get("cpu_s", 0.0))
        if p in prods:
            result.produced += int(info.get("produced", 0))
            if "t1" in info:
                prod_t1.append(info["t1"])
            continue
        if "t1" in info:
            take_t1.append(info["t1"])
        result.live.samples_us += info["lat_us"]
        result.calls += info["calls"]
        result.empty_calls += info["empty"]
        batches = info["batches"]
        every += [i for batch in batches for i in batch]
        result.bad_batches += sum(not whole_groups(batch) for batch in batches)
        result.per_consumer.append(sum(len(batch) for batch in batches))
    total = result.total
    result.taken = len(every)
    uniq = set(every)
    result.unique = len(uniq)
    result.duplicates = result.taken - result.unique
    result.foreign = len(uniq - set(range(total)))
    result.missing = total - len(uniq & set(range(total)))
    result.produce_s = span(t0s, prod_t1)
    result.take_s = span(t0s, take_t1)


# -- driver ---------------------------------------------------------------------------------------------------


def run_samples_bench(
    base: Path,
    *,
    puts: int,
    latency_n: int,
    warmup: int,
    put_interval_s: float = 0.0,
    get_timeout: float = GET_TIMEOUT_S,
    seed: int = 0,
    progress: bool = True,
    tq_ref: bool = True,
) -> SamplesBenchResult:
    t_start = time.perf_counter()
    sock = base / "s"
    sock.mkdir(parents=True, exist_ok=True)
    address = f"ipc://{sock / 'b.sock'}"
    work = base / "work"
    work.mkdir()
    log_path = base / "broker.log"
    result = SamplesBenchResult()
    result.settings = {
        "puts_per_producer": puts,
        "producers": PRODUCERS,
        "consumers": CONSUMERS,
        "put_rows": PUT_ROWS,
        "take": TAKE,
        "group_n": GROUP_N,
        "put_interval_s": put_interval_s,
        "get_timeout_s": get_timeout,
        "latency_n": latency_n,
        "warmup": warmup,
        "seed": seed,
    }
    total = 3 * (latency_n + warmup) + BACKLOG_CALLS + PRODUCERS * puts * PUT_ROWS
    with tqdm(total=total, unit="op", unit_scale=True, file=sys.stderr, disable=not progress) as bar:
        bar.set_description("starting broker")
        with broker_process(base / "storage", address, log_path, (), "WARNING") as proc:
            # First, on the fresh broker: hello's reply counts the arena's extents, which the later puts add.
            bar.set_description(f"floor: hello from {CONSUMERS} processes")
            result.floor_rate = round_trips_per_s(address, CONSUMERS, work, result.errors)
            bar.set_description("reference: hello / get_meta, idle")
            asyncio.run(_reference(address, latency_n, warmup, result, bar.update))
            bar.set_description("2 producers, 4 consumers")
            _workload(address, proc.pid, work, puts, put_interval_s, get_timeout, seed, result, bar.update)
        bar.set_description("TransferQueue get_meta (Ray)")
        if tq_ref:
            run_tq_reference(latency_n, warmup, result, bar.update)
        else:
            result.settings["transferqueue"] = "not measured (--no-transferqueue)"
    result.broker_log = log_lines(log_path)
    result.wall_s = time.perf_counter() - t_start
    return result
