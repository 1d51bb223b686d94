"""The ``samples`` benchmark: ``get_meta`` (consume-on-fetch sample hand-out with ``GRPOGroupNSampler``) through
the broker, 2 producer processes and 4 consumer processes of one task, against the protocol's ``hello`` round
trip (the floor of any request) in the same run.

One broker (a subprocess on fresh temp storage, an ipc socket under /tmp, ``--log-level WARNING``). Every worker
is a ``spawn``-ed process (Lance is not fork-safe) that opens its queue, then waits on one barrier, so start-up is
never timed; ``time.monotonic`` is one clock for all processes on Linux.

1. Reference, in this process before the workload, broker idle: ``hello`` via
   ``persisting.remote.connection(address).request("hello", {})`` (envelope, dispatch, reply; no topic, no
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
import contextlib
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from persisting import GRPOGroupNSampler, Queue
from persisting.remote import connection

from .broker_bench import broker_process
from .report import FORMATS, plain_table, rst_table

GROUP_N = 8  # GRPO samples per prompt
PUT_ROWS = 64  # samples per put: 8 whole groups
TAKE = 16  # samples per get_meta: 2 groups
FEATURES = 16  # x is float32[64, 16]
PRODUCERS = 2
CONSUMERS = 4
START_TIMEOUT_S = 120.0
CASE_LIMIT_S = 120.0  # the workload's processes must be done by then
GET_TIMEOUT_S = 0.5  # get_meta(wait=True, timeout=...): how long an idle consumer waits before it looks again
LATENCY_ROUNDS = 8
PROBE_INTERVAL_S = 0.01  # hello round trips timed during the workload, one per this many seconds
BACKLOG_EVERY_S = 0.05  # backlog sampling period during the workload
AIM_P50_MS = 0.5
BACKLOG = 32_768  # untaken samples in the backlog reference
BACKLOG_CALLS = 100
TRANSFER_QUEUE = "not measured (its get_meta took 2.7-11 ms p50 per the design brief)"

Tick = Callable[[int], None]


def _pct(sorted_samples: list[float], q: float) -> float:
    return sorted_samples[max(0, math.ceil(q * len(sorted_samples)) - 1)]  # nearest rank


@dataclass(slots=True)
class Series:
    key: str
    label: str
    samples_us: list[float] = field(default_factory=list)

    def p(self, q: float) -> float | None:
        return _pct(sorted(self.samples_us), q) if self.samples_us else None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "n": len(self.samples_us), "p50_us": self.p(0.5),
                "p99_us": self.p(0.99)}  # fmt: skip


@dataclass(slots=True)
class SamplesBenchResult:
    hello: Series = field(default_factory=lambda: Series("hello", "protocol hello"))
    idle: Series = field(default_factory=lambda: Series("get_meta-idle", "get_meta, samples ready"))
    backlog: Series = field(default_factory=lambda: Series("get_meta-backlog", "get_meta, 32,768 untaken"))
    live: Series = field(default_factory=lambda: Series("get_meta-live", "get_meta, 2 producers + 4 consumers"))
    hello_live: Series = field(default_factory=lambda: Series("hello-live", "protocol hello during the workload"))
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds during the workload: broker, producers, ...
    workload_s: float = 0.0  # wall seconds the CPU times above were taken over (barrier -> every sample taken)
    max_backlog: int = 0  # most samples put and not yet taken, sampled every 50 ms during the workload
    total: int = 0  # samples the producers set out to put
    produced: int = 0  # samples whose put returned
    taken: int = 0  # samples handed to consumers, duplicates included
    unique: int = 0
    duplicates: int = 0
    missing: int = 0  # put, never taken
    foreign: int = 0  # taken indexes outside 0..N-1
    calls: int = 0  # get_meta calls in the workload, empty ones included
    empty_calls: int = 0
    bad_batches: int = 0  # batches not made of whole aligned groups
    per_consumer: list[int] = field(default_factory=list)
    produce_s: float = 0.0  # first worker start -> last put returned
    take_s: float = 0.0  # first worker start -> last sample taken
    errors: list[str] = field(default_factory=list)
    broker_log: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def take_rate(self) -> float:
        return self.unique / self.take_s if self.take_s > 0 else 0.0

    @property
    def produce_rate(self) -> float:
        return self.produced / self.produce_s if self.produce_s > 0 else 0.0

    @property
    def correct(self) -> bool:
        return (
            not self.errors
            and self.unique == self.total
            and not (self.duplicates or self.missing or self.foreign or self.bad_batches)
        )


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


def _write(path: str, info: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(info))


def producer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    try:
        asyncio.run(_producer(spec, info))
    except BaseException as exc:
        info["error"] = repr(exc)
        with contextlib.suppress(Exception):
            spec["barrier"].abort()
    _write(spec["out"], info)


async def _producer(spec: dict[str, Any], info: dict[str, Any]) -> None:
    rng = np.random.default_rng(spec["seed"] + spec["index"])
    pool = [rng.standard_normal((PUT_ROWS, FEATURES), dtype=np.float32) for _ in range(4)]
    lens = [int(v) for v in rng.integers(1, 4096, PUT_ROWS)]
    q = Queue(spec["topic"], broker=spec["broker"], durability="process")
    await q.open()
    try:
        spec["barrier"].wait(START_TIMEOUT_S)
        info["t0"] = time.monotonic()
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
    finally:
        await q.aclose()


def consumer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {"lat_us": [], "batches": [], "calls": 0, "empty": 0}
    try:
        asyncio.run(_consumer(spec, info))
    except BaseException as exc:
        info["error"] = repr(exc)
        with contextlib.suppress(Exception):
            spec["barrier"].abort()
    _write(spec["out"], info)


async def _consumer(spec: dict[str, Any], info: dict[str, Any]) -> None:
    total, taken, producers_done = spec["total"], spec["taken"], spec["producers_done"]
    sampler = GRPOGroupNSampler(GROUP_N)
    q = Queue(spec["topic"], broker=spec["broker"], durability="process")
    await q.open()
    try:
        spec["barrier"].wait(START_TIMEOUT_S)
        info["t0"] = time.monotonic()
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
    finally:
        await q.aclose()


def _whole_groups(indexes: list[int]) -> bool:
    if not indexes or len(indexes) % GROUP_N:
        return False
    for k in range(0, len(indexes), GROUP_N):
        start = indexes[k]
        if start % GROUP_N or indexes[k : k + GROUP_N] != list(range(start, start + GROUP_N)):
            return False
    return True


def _proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None: unknown, e.g. not Linux)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on: "pid (comm) " may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


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
    barrier = ctx.Barrier(PRODUCERS + CONSUMERS + 1)
    taken = ctx.Value("q", 0)
    put_count = ctx.Value("q", 0)
    producers_done = ctx.Event()
    common = {"broker": broker, "topic": "samples", "barrier": barrier, "seed": seed}
    prods = [
        ctx.Process(
            target=producer_main,
            args=(
                {
                    **common,
                    "index": i,
                    "puts": puts,
                    "put_interval_s": put_interval_s,
                    "put_count": put_count,
                    "out": str(work / f"producer-{i}.json"),
                },
            ),
            name=f"producer-{i}",
            daemon=True,
        )
        for i in range(PRODUCERS)
    ]
    cons = [
        ctx.Process(
            target=consumer_main,
            args=(
                {
                    **common,
                    "index": i,
                    "total": total,
                    "taken": taken,
                    "producers_done": producers_done,
                    "get_timeout": get_timeout,
                    "out": str(work / f"consumer-{i}.json"),
                },
            ),
            name=f"consumer-{i}",
            daemon=True,
        )
        for i in range(CONSUMERS)
    ]
    for p in [*prods, *cons]:
        p.start()
    seen = [0]

    async def monitor() -> None:
        conn = connection(broker)
        await conn.request("hello", {})  # connected before the clock starts
        barrier.wait(START_TIMEOUT_S)
        t_start, broker_cpu0 = time.monotonic(), _proc_cpu_s(broker_pid)
        deadline = t_start + CASE_LIMIT_S + 10
        next_backlog = t_start
        while any(p.is_alive() for p in cons) and time.monotonic() < deadline:
            if not producers_done.is_set() and not any(p.is_alive() for p in prods):
                producers_done.set()
            if not result.workload_s and taken.value >= total:  # the busy part is over (consumers idle from here)
                result.workload_s = time.monotonic() - t_start
                broker_cpu1 = _proc_cpu_s(broker_pid)
                if broker_cpu0 is not None and broker_cpu1 is not None:
                    result.cpu_s["broker"] = broker_cpu1 - broker_cpu0
                result.cpu_s["bench process"] = time.process_time() - cpu0
            t0 = time.perf_counter_ns()
            await conn.request("hello", {})
            result.hello_live.samples_us.append((time.perf_counter_ns() - t0) / 1e3)
            if time.monotonic() >= next_backlog:
                got = taken.value
                result.max_backlog = max(result.max_backlog, put_count.value - got)
                tick(got - seen[0])
                seen[0] = got
                next_backlog += BACKLOG_EVERY_S
            await asyncio.sleep(PROBE_INTERVAL_S)

    cpu0 = time.process_time()
    try:
        asyncio.run(monitor())
    except Exception as exc:
        result.errors.append(f"start failed: {exc!r}")
    producers_done.set()
    for p in [*prods, *cons]:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(5)
            result.errors.append(f"{p.name} did not finish; terminated")
        elif p.exitcode:
            result.errors.append(f"{p.name} exit code {p.exitcode}")
    tick(taken.value - seen[0])

    t0s: list[float] = []
    prod_t1: list[float] = []
    take_t1: list[float] = []
    every: list[int] = []
    for p in [*prods, *cons]:
        path = work / f"{p.name}.json"
        if not path.exists():
            result.errors.append(f"{p.name}: no result file")
            continue
        info = json.loads(path.read_text())
        if "error" in info:
            result.errors.append(f"{p.name}: {info['error']}")
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
        mine = 0
        for batch in info["batches"]:
            mine += len(batch)
            every += batch
            if not _whole_groups(batch):
                result.bad_batches += 1
        result.per_consumer.append(mine)
    result.taken = len(every)
    uniq = set(every)
    result.unique = len(uniq)
    result.duplicates = result.taken - result.unique
    result.foreign = len(uniq - set(range(total)))
    result.missing = total - len(uniq & set(range(total)))
    if t0s and prod_t1:
        result.produce_s = max(prod_t1) - min(t0s)
    if t0s and take_t1:
        result.take_s = max(take_t1) - min(t0s)


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
    total = 2 * (latency_n + warmup) + BACKLOG_CALLS + PRODUCERS * puts * PUT_ROWS
    with tqdm(total=total, unit="op", unit_scale=True, file=sys.stderr, disable=not progress) as bar:
        bar.set_description("starting broker")
        with broker_process(base / "storage", address, log_path, (), "WARNING") as proc:
            bar.set_description("reference: hello / get_meta, idle")
            asyncio.run(_reference(address, latency_n, warmup, result, bar.update))
            bar.set_description("2 producers, 4 consumers")
            _workload(address, proc.pid, work, puts, put_interval_s, get_timeout, seed, result, bar.update)
    if log_path.exists():
        result.broker_log = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    result.wall_s = time.perf_counter() - t_start
    return result


# -- report -------------------------------------------------------------------------------------------------

HEADERS = ("series", "calls timed", "p50 ms", "p99 ms", "p50 vs hello")
AIM_HEADERS = ("aim", "measured", "target", "met")


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def rows(result: SamplesBenchResult) -> list[list[str]]:
    floor = result.hello.p(0.5)
    out = []
    labels = {
        "hello": "protocol `hello` round trip (the floor), idle broker",
        "get_meta-idle": f"get_meta {TAKE} (GRPO n={GROUP_N}), 64-128 samples ready, 1 caller, idle broker",
        "get_meta-backlog": f"get_meta {TAKE} (GRPO n={GROUP_N}), {BACKLOG:,} samples ready, 1 caller, idle broker",
        "get_meta-live": f"get_meta {TAKE} (GRPO n={GROUP_N}, wait=True), {CONSUMERS} consumers during "
        f"{PRODUCERS} producers' puts; calls that returned samples",
        "hello-live": f"protocol `hello` round trip during the workload (bench process, one per "
        f"{PROBE_INTERVAL_S * 1e3:g} ms)",
    }
    for s in (result.hello, result.idle, result.backlog, result.live, result.hello_live):
        p50 = s.p(0.5)
        ratio = f"{p50 / floor:.2f}x" if p50 is not None and floor else "-"
        out.append([labels[s.key], f"{len(s.samples_us):,}", _ms(p50), _ms(s.p(0.99)), ratio])
    out.append(["TransferQueue get_meta", "-", TRANSFER_QUEUE, "-", "-"])
    return out


def workload_rows(result: SamplesBenchResult) -> list[list[str]]:
    return [
        ["samples put / taken (unique)", f"{result.produced:,} / {result.unique:,} of {result.total:,}"],
        ["samples taken per s (overall)", f"{result.take_rate:,.0f}"],
        ["samples put per s (producers)", f"{result.produce_rate:,.0f}"],
        ["taken per consumer", ", ".join(f"{n:,}" for n in result.per_consumer)],
        ["duplicates / missing / foreign", f"{result.duplicates} / {result.missing} / {result.foreign}"],
        ["batches not whole aligned groups", f"{result.bad_batches} of {len(result.live.samples_us):,}"],
        ["get_meta calls (empty after timeout)", f"{result.calls:,} ({result.empty_calls:,})"],
        ["largest backlog seen (put, not taken)", f"{result.max_backlog:,} samples"],
        [
            f"CPU during the workload ({result.workload_s:.2f} s wall, {os.cpu_count()} cores), % of one core",
            ", ".join(f"{k} {v / result.workload_s:.0%}" for k, v in result.cpu_s.items())
            if result.workload_s
            else "-",
        ],
        ["correct", "yes" if result.correct else "NO"],
    ]


def aims(result: SamplesBenchResult) -> list[list[str]]:
    out = []
    for s, what in ((result.live, "workload"), (result.idle, "64-128 samples ready, idle")):
        p50 = s.p(0.5)
        if p50 is None:
            continue
        out.append(
            [
                f"get_meta p50 ({what})",
                f"{p50 / 1e3:.3f} ms",
                f"< {AIM_P50_MS:g} ms",
                "met" if p50 / 1e3 < AIM_P50_MS and result.correct else "NO",
            ]
        )
    return out


def _notes(result: SamplesBenchResult) -> list[str]:
    s = result.settings
    notes = [
        f"Workload: {PRODUCERS} producers x {s['puts_per_producer']:,} puts of {PUT_ROWS} samples "
        f'({{"x": float32[{PUT_ROWS}, {FEATURES}], "len": {PUT_ROWS} ints}}, {PUT_ROWS // GROUP_N} groups of '
        f"n={GROUP_N}), "
        + (f"one put per {s['put_interval_s'] * 1e3:g} ms" if s["put_interval_s"] > 0 else "as fast as they can")
        + ', durability="process" (the take log is written, not fsynced); '
        f"{CONSUMERS} consumers of task 'train' call get_meta(['x'], {TAKE}, 'train', 'p', "
        f"sampler=GRPOGroupNSampler({GROUP_N}), wait=True, timeout={s['get_timeout_s']:g}) until all are taken.",
        "Workload latency: per get_meta call that returned samples, in the consumer, perf_counter around the await; "
        "it includes waiting in the broker for the next put when the consumers are ahead of the producers, and "
        "the machine's cores are shared by 7 processes. Empty calls (the timeout ran out) are counted, not timed. "
        f"The backlog is sampled every {BACKLOG_EVERY_S * 1e3:g} ms from the producers' and consumers' shared "
        f"counters; the bench process times one hello every {PROBE_INTERVAL_S * 1e3:g} ms meanwhile. CPU: "
        "process_time of each worker from the barrier to its last put or last batch, the broker's utime+stime from "
        "/proc and the bench process's own up to the moment every sample was taken; as a share of that wall time "
        "(barrier -> every sample taken, seen by the 10 ms probe loop).",
        f"Reference: {s['latency_n']:,} calls per series after {s['warmup']:,} untimed, hello and get_meta "
        f"interleaved in {LATENCY_ROUNDS} rounds, in the bench's process, before the workload (broker otherwise "
        "idle); get_meta there is on its own topic kept at 64-128 untaken samples by untimed puts, wait=False, "
        f"every call returned {TAKE} samples. Then {BACKLOG_CALLS} get_meta calls on a topic prefilled with "
        f"{BACKLOG:,} untaken samples (each call pays for the backlog: see the README).",
        "samples taken per s = unique samples taken / (first worker start after the barrier -> last sample taken).",
        f"Correctness: the union of all consumers' global indexes must be 0..N-1 (N = {result.total:,}) with no "
        f"index twice; every returned batch must be runs of {GROUP_N} consecutive indexes starting at a multiple of "
        f"{GROUP_N}.",
        f"TransferQueue: {TRANSFER_QUEUE}; not installable here.",
    ]
    notes += [f"ERROR: {e}" for e in result.errors]
    if result.broker_log:
        notes.append(f"broker log lines at WARNING or above: {len(result.broker_log)}")
        notes += [f"  {line}" for line in result.broker_log[:10]]
    notes.append(
        f"Whole run: {result.wall_s:.1f} s wall. Timings are from one run on a shared machine: compare ratios "
        "within it, not across runs."
    )
    return notes


def render_samples(result: SamplesBenchResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(
            {
                "meta": result.meta,
                "settings": result.settings,
                "wall_s": result.wall_s,
                "series": [
                    s.to_json() for s in (result.hello, result.idle, result.backlog, result.live, result.hello_live)
                ],
                "cpu_s": result.cpu_s,
                "workload_s": result.workload_s,
                "workload": dict(workload_rows(result)),
                "aims": [dict(zip(AIM_HEADERS, a, strict=True)) for a in aims(result)],
                "errors": result.errors,
                "broker_log": result.broker_log,
            },
            indent=2,
        )
    meta = [f"{k}: {v}" for k, v in result.meta.items()]
    work_headers = ("workload", "value")
    if fmt == "console":
        parts = [*meta, "", plain_table(HEADERS, rows(result)), "", plain_table(work_headers, workload_rows(result))]
        if aims(result):
            parts += ["", plain_table(AIM_HEADERS, aims(result))]
        parts += ["", *_notes(result)]
        return "\n".join(parts)
    if fmt != "rst":
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    parts = ["Samples benchmark (get_meta)", "============================", ""]
    parts += [f"- {line}" for line in meta] + ["", "Latency", "-------", ""]
    parts += [rst_table(HEADERS, rows(result)), ""]
    parts += ["Workload", "--------", "", rst_table(work_headers, workload_rows(result)), ""]
    if aims(result):
        parts += ["Aims", "----", "", rst_table(AIM_HEADERS, aims(result)), ""]
    parts += ["Notes", "-----", ""] + [f"- {line}" for line in _notes(result)]
    return "\n".join(parts)
