"""The ``arena`` benchmark: tensor batches from a producer process to a consumer process through the broker's
shared-memory arena, against a plain memcpy of the same bytes (the limit) and ``torch.multiprocessing.Queue``
(tensors in shared memory, passed as file descriptors) in the same run.

Every case runs in two spawned processes (Lance is not fork-safe: the ``spawn`` method everywhere), a producer and
a consumer, started and opened before a barrier so that start-up is never timed. ``time.monotonic`` is one clock
for all processes on Linux: the producer writes the time each ``put`` returned into a shared array (per batch),
the consumer the time it held each batch's views; hand-over latency = receive time - put-return time, aligned by
batch order.

- ``persisting arena``: ``Queue(topic, broker=..., durability="process")``; the producer ``put``s a dict of numpy
  arrays (batch dim 0, ``partition_id``), the consumer calls ``get_batch(fields, batch_size, task_name,
  partition_id, wait=True)`` (get_meta + get_data in one round trip, waiting in the broker): read-only numpy views
  on the broker's arena. Each case gets its own broker (fresh storage, fresh arena of ``--arena-bytes``). ``put``
  returns after its one copy into the arena and the ``put_tensors`` round trip (the extent was leased ahead).
- ``torch.multiprocessing.Queue``: the producer allocates shared-memory tensors per batch
  (``torch.empty(...).share_memory_()``), copies the same data in (the same one copy), ``put``s a dict of them;
  the consumer's blocking ``get`` maps them (file-descriptor strategy). ``put`` returns before the feeder thread
  has pickled and sent anything.
- ``memcpy``: ``np.copyto`` of the same batches into a preallocated, pre-faulted destination ring (larger than any
  cache), one thread, in this process: the bandwidth bound of one copy.

Two modes per path: ``stream`` (the producer puts as fast as it can: GB/s = bytes / (first put starts -> last
batch received); latency includes queueing behind earlier batches) and ``paced`` (the producer waits for the
consumer to have batch i-1 before it puts batch i: the hand-over latency of an idle pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from persisting import Queue

from .broker_bench import broker_process
from .report import FORMATS, plain_table, rst_table

GiB = 1 << 30
MiB = 1 << 20
START_TIMEOUT_S = 120.0
RECV_TIMEOUT_S = 60.0  # a consumer that waits this long for the next batch gives up
CASE_LIMIT_S = 150.0  # a case whose processes run longer is stopped (reported as an error)
WARMUP = 2  # untimed batches through the same path before the barrier (arena attach, first faults)
PACED_BATCHES = 16
POOL = 4  # distinct source batches per producer, used in turn (so the source is not one cache-hot array)
STREAM_AIM_GBPS = 1.5
HANDOVER_AIM_MS = 1.0

Tick = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Shape:
    key: str  # "6MiB" / "64MiB"
    rows: int  # samples per batch
    fields: tuple[tuple[str, str, int], ...]  # (name, dtype, per-sample length)

    @property
    def batch_bytes(self) -> int:
        return sum(self.rows * n * np.dtype(dt).itemsize for _name, dt, n in self.fields)

    @property
    def label(self) -> str:
        inner = " + ".join(f"{dt}[{n}]" for _name, dt, n in self.fields)
        return f"{self.rows} x ({inner})" if len(self.fields) > 1 else f"{self.rows} x {inner}"

    @property
    def names(self) -> list[str]:
        return [name for name, _dt, _n in self.fields]


SMALL = Shape("6MiB", 256, (("input_ids", "int64", 1024), ("logprobs", "float32", 4096)))
LARGE = Shape("64MiB", 64, (("x", "float32", 262144),))


def make_pool(shape: Shape, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(POOL):
        batch = {}
        for name, dt, n in shape.fields:
            if np.dtype(dt).kind == "i":
                batch[name] = rng.integers(0, 50_000, size=(shape.rows, n), dtype=dt)
            else:
                batch[name] = rng.standard_normal(size=(shape.rows, n), dtype=np.float32).astype(dt, copy=False)
        pool.append(batch)
    return pool


def stamp(batch: dict[str, Any], i: int) -> None:
    """Mark a source batch with its batch number (first element of the first field), in place."""
    first = next(iter(batch.values()))
    first[0, 0] = i


def stamp_of(batch: dict[str, Any]) -> int:
    return int(next(iter(batch.values()))[0, 0])


# -- results ------------------------------------------------------------------------------------------------


def _pct(sorted_samples: list[float], q: float) -> float:
    return sorted_samples[max(0, math.ceil(q * len(sorted_samples)) - 1)]  # nearest rank


@dataclass(slots=True)
class Row:
    key: str
    path: str
    mode: str  # "stream" or "paced" (memcpy: "copy")
    shape: str
    batch_bytes: int
    batches: int
    settings: str
    received: int = 0
    seconds: float = 0.0
    latency_ms: list[float] = field(default_factory=list)  # put returned -> consumer has the batch
    from_start_ms: list[float] = field(default_factory=list)  # put called (before the copy) -> consumer has it
    memcpy_gbps: float | None = None  # the memcpy reference of the same batch size, for the ratio
    copied_bytes: int | None = None  # persisting: bytes the consumer got as copies instead of views
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def gbps(self) -> float:
        return self.received * self.batch_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def p(self, q: float, samples: list[float] | None = None) -> float | None:
        samples = self.latency_ms if samples is None else samples
        return _pct(sorted(samples), q) if samples else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("latency_ms")
        out.pop("from_start_ms")
        out.update(gbps=self.gbps, p50_ms=self.p(0.5), p99_ms=self.p(0.99), latency_n=len(self.latency_ms))
        out.update(from_put_start_p50_ms=self.p(0.5, self.from_start_ms))
        return out


@dataclass(slots=True)
class ArenaBenchResult:
    rows: list[Row] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)  # zero-copy evidence from the consumer
    broker_log: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)


# -- the workers (spawned) ----------------------------------------------------------------------------------


def _shm_mapping(address: int) -> str | None:
    """The file behind the mapping of this process that holds ``address`` (None: not file-backed / not found)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5] if len(parts) == 6 else None
    return None


def _zero_copy_check(path: str, data: dict[str, Any]) -> str:
    out = []
    for name, arr in data.items():
        if isinstance(arr, np.ndarray):
            addr = arr.__array_interface__["data"][0]
            where = _shm_mapping(addr)
            if where is not None and where.startswith("/dev/shm/"):
                place = f"a /dev/shm mapping ({os.path.basename(where)})"
            else:
                place = f"NOT a /dev/shm mapping ({where!r})"
            out.append(
                f"{name}: {type(arr).__name__} {arr.dtype}{list(arr.shape)}, "
                f"flags.writeable={arr.flags.writeable}, data address in {place} of /proc/self/maps"
            )
        else:  # torch
            out.append(f"{name}: torch {arr.dtype}{list(arr.shape)}, is_shared()={arr.is_shared()}")
    return f"{path}: " + "; ".join(out)


def arena_producer_main(spec: dict[str, Any]) -> None:
    asyncio.run(_arena_producer(spec))


async def _arena_producer(spec: dict[str, Any]) -> None:
    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)  # a hang leaves its stack on stderr
    try:
        shape: Shape = spec["shape"]
        pool = make_pool(shape, spec["seed"])
        put_t, start_t, done = spec["put_t"], spec["start_t"], spec["received"]
        q = Queue(spec["topic"], broker=spec["broker"], durability="process")
        await q.open()
        try:
            for i in range(WARMUP):
                await q.put(pool[i % POOL], partition_id="warm", timeout=spec["put_timeout"])
            spec["barrier"].wait(START_TIMEOUT_S)
            spec["t0"].value = time.monotonic()
            for i in range(spec["batches"]):
                if spec["paced"]:
                    while done.value < i:
                        await asyncio.sleep(0.001)
                    await asyncio.sleep(0.002)  # let the consumer settle into its poll
                batch = pool[i % POOL]
                stamp(batch, i)
                start_t[i] = time.monotonic()
                await q.put(batch, partition_id="p", timeout=spec["put_timeout"])
                put_t[i] = time.monotonic()
        finally:
            await q.aclose()
    except BaseException as exc:
        spec["errors"].put(f"producer: {exc!r}")
        with contextlib.suppress(Exception):
            spec["barrier"].abort()


def arena_consumer_main(spec: dict[str, Any]) -> None:
    try:
        asyncio.run(_arena_consumer(spec))
    except BaseException as exc:
        spec["errors"].put(f"consumer: {exc!r}")
        with contextlib.suppress(Exception):
            spec["barrier"].abort()


async def _arena_consumer(spec: dict[str, Any]) -> None:
    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)  # a hang leaves its stack on stderr
    shape: Shape = spec["shape"]
    recv_t, done = spec["recv_t"], spec["received"]
    q = Queue(spec["topic"], broker=spec["broker"], durability="process")
    await q.open()
    try:
        warm = 0
        deadline = time.monotonic() + START_TIMEOUT_S
        while warm < WARMUP * shape.rows and time.monotonic() < deadline:
            meta = await q.get_meta(fields=shape.names, batch_size=shape.rows, task_name="train", partition_id="warm")
            if len(meta):
                warm += len(meta)
                # get_data too: the first one maps the arena (MAP_POPULATE of the whole file), once per process
                data = await q.get_data(meta)
                del meta, data
            else:
                await asyncio.sleep(0.001)
        moved0 = (await q.stats())["zerocopy"]
        spec["barrier"].wait(START_TIMEOUT_S)
        samples = 0
        batch_no = 0
        last = time.monotonic()
        while batch_no < spec["batches"]:
            # get_batch: take and data in one round trip, waiting in the broker (a long-poll woken by the put).
            data, meta = await q.get_batch(
                shape.names,
                batch_size=shape.rows,
                task_name="train",
                partition_id="p",
                wait=True,
                timeout=RECV_TIMEOUT_S,
            )
            if len(meta) == 0:
                if time.monotonic() - last > RECV_TIMEOUT_S:
                    raise TimeoutError(f"no batch {batch_no} within {RECV_TIMEOUT_S:g} s")
                continue
            now = last = time.monotonic()
            first_sample = samples
            samples += len(meta)
            if first_sample % shape.rows == 0 and stamp_of(data) != batch_no:
                raise AssertionError(f"batch {batch_no}: stamp {stamp_of(data)} (order or content broken)")
            if spec["check"] and batch_no == 0:
                spec["errors"].put("check: " + _zero_copy_check("persisting arena get_batch", data))
            del data  # release the views: the broker may reuse the extent once it is flushed
            while samples >= (batch_no + 1) * shape.rows:
                recv_t[batch_no] = now
                batch_no += 1
                done.value = batch_no
        moved = (await q.stats())["zerocopy"]
        zero = moved["get_zero_copy_bytes"] - moved0["get_zero_copy_bytes"]
        copied = moved["get_copied_bytes"] - moved0["get_copied_bytes"]
        spec["errors"].put(f"moved: {zero} {copied}")
    finally:
        await q.aclose()


def torch_producer_main(spec: dict[str, Any]) -> None:
    import torch

    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)
    try:
        shape: Shape = spec["shape"]
        pool = [{k: torch.from_numpy(v) for k, v in b.items()} for b in make_pool(shape, spec["seed"])]
        put_t, start_t, done, q = spec["put_t"], spec["start_t"], spec["received"], spec["queue"]
        for i in range(WARMUP):
            q.put({name: t.clone().share_memory_() for name, t in pool[i % POOL].items()})
        spec["barrier"].wait(START_TIMEOUT_S)
        spec["t0"].value = time.monotonic()
        for i in range(spec["batches"]):
            if spec["paced"]:
                while done.value < i:
                    time.sleep(0.001)
                time.sleep(0.002)
            start_t[i] = time.monotonic()
            src = pool[i % POOL]
            stamp(src, i)
            out = {}
            for name, t in src.items():
                buf = torch.empty(t.shape, dtype=t.dtype).share_memory_()
                buf.copy_(t)
                out[name] = buf
            q.put(out)
            put_t[i] = time.monotonic()
            del out
        spec["consumer_done"].wait(RECV_TIMEOUT_S * 2)  # the fds must stay servable until the consumer has them
    except BaseException as exc:
        spec["errors"].put(f"producer: {exc!r}")
        with contextlib.suppress(Exception):
            spec["barrier"].abort()


def torch_consumer_main(spec: dict[str, Any]) -> None:
    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)
    try:
        recv_t, done, q = spec["recv_t"], spec["received"], spec["queue"]
        for _ in range(WARMUP):
            q.get(timeout=START_TIMEOUT_S)
        spec["barrier"].wait(START_TIMEOUT_S)
        for i in range(spec["batches"]):
            data = q.get(timeout=RECV_TIMEOUT_S)
            now = time.monotonic()
            if stamp_of(data) != i:
                raise AssertionError(f"batch {i}: stamp {stamp_of(data)} (order or content broken)")
            if spec["check"] and i == 0:
                spec["errors"].put("check: " + _zero_copy_check("torch.multiprocessing.Queue get", data))
            del data
            recv_t[i] = now
            done.value = i + 1
    except BaseException as exc:
        spec["errors"].put(f"consumer: {exc!r}")
        with contextlib.suppress(Exception):
            spec["barrier"].abort()
    finally:
        spec["consumer_done"].set()


# -- one case -----------------------------------------------------------------------------------------------


def _run_pair(
    ctx: Any,
    producer: Callable[[dict[str, Any]], None],
    consumer: Callable[[dict[str, Any]], None],
    spec: dict[str, Any],
    row: Row,
    result: ArenaBenchResult,
    tick: Tick,
) -> None:
    n = spec["batches"]
    spec.update(
        put_t=ctx.Array("d", n, lock=False),
        start_t=ctx.Array("d", n, lock=False),
        recv_t=ctx.Array("d", n, lock=False),
        received=ctx.Value("q", 0, lock=False),
        t0=ctx.Value("d", 0.0, lock=False),
        barrier=ctx.Barrier(3),
        errors=ctx.SimpleQueue(),
    )
    procs = [
        ctx.Process(target=producer, args=(spec,), name="producer", daemon=True),
        ctx.Process(target=consumer, args=(spec,), name="consumer", daemon=True),
    ]
    for p in procs:
        p.start()
    seen = 0
    try:
        spec["barrier"].wait(START_TIMEOUT_S)
        deadline = time.monotonic() + CASE_LIMIT_S
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            got = spec["received"].value
            tick(got - seen)
            seen = got
            time.sleep(0.05)
    except Exception as exc:
        row.errors.append(f"start failed: {exc!r}")
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.terminate()
            p.join(5)
            row.errors.append(f"{p.name} did not finish; terminated")
        elif p.exitcode:
            row.errors.append(f"{p.name} exit code {p.exitcode}")
    tick(spec["received"].value - seen)
    while not spec["errors"].empty():
        msg = spec["errors"].get()
        if msg.startswith("check: "):
            result.checks.append(msg[len("check: ") :])
        elif msg.startswith("moved: "):
            zero, copied = (int(x) for x in msg.split()[1:])
            row.notes.append(
                f"consumer got {zero / MiB:,.0f} MiB as views on the arena, {copied / MiB:,.0f} MiB as copies "
                "(samples whose extent was already flushed to Lance and dropped are read back from Lance)"
            )
            row.copied_bytes = copied
        else:
            row.errors.append(msg)
    row.received = spec["received"].value
    put_t, recv_t = list(spec["put_t"]), list(spec["recv_t"])
    if row.received:
        row.seconds = recv_t[row.received - 1] - spec["t0"].value
        start_t = list(spec["start_t"])
        row.latency_ms = [(recv_t[i] - put_t[i]) * 1e3 for i in range(row.received) if put_t[i] > 0]
        row.from_start_ms = [(recv_t[i] - start_t[i]) * 1e3 for i in range(row.received) if start_t[i] > 0]


def run_arena_case(
    ctx: Any,
    base: Path,
    shape: Shape,
    batches: int,
    paced: bool,
    arena_bytes: int,
    seed: int,
    check: bool,
    result: ArenaBenchResult,
    tick: Tick,
    beyond: bool = False,
    put_timeout: float = 30.0,
) -> Row:
    mode = "paced" if paced else "stream"
    key = f"arena-{shape.key}-{mode}" + ("-beyond" if beyond else "")
    row = Row(
        key,
        "persisting arena",
        mode,
        shape.label,
        shape.batch_bytes,
        batches,
        f'broker --arena-bytes {arena_bytes // MiB:,} MiB, durability="process", put(partition_id) -> '
        f"get_batch(batch_size={shape.rows}, wait=True) (one round trip)",
    )
    case = base / key
    case.mkdir()
    sock = case / "s"
    sock.mkdir()
    address = f"ipc://{sock / 'b.sock'}"
    log_path = base / "broker.log"
    spec = {
        "shape": shape,
        "batches": batches,
        "paced": paced,
        "seed": seed,
        "check": check,
        "broker": address,
        "topic": "bench",
        "put_timeout": put_timeout,
    }
    t_stop = 0.0
    with broker_process(case / "storage", address, log_path, ["--arena-bytes", str(arena_bytes)], "WARNING"):
        _run_pair(ctx, arena_producer_main, arena_consumer_main, spec, row, result, tick)
        t_stop = time.perf_counter()
    row.notes.append(f"broker stop (SIGTERM, flushes the rest to Lance) took {time.perf_counter() - t_stop:.1f} s")
    return row


def run_torch_case(
    ctx: Any, shape: Shape, batches: int, paced: bool, seed: int, check: bool, result: ArenaBenchResult, tick: Tick
) -> Row:
    import torch.multiprocessing as tmp

    mode = "paced" if paced else "stream"
    row = Row(
        f"torch-{shape.key}-{mode}",
        "torch.multiprocessing.Queue",
        mode,
        shape.label,
        shape.batch_bytes,
        batches,
        f"spawn context, sharing strategy {tmp.get_sharing_strategy()}; producer copies each batch into fresh "
        "share_memory_() tensors, put(dict); consumer get() (blocking)",
    )
    tctx = tmp.get_context("spawn")
    spec = {
        "shape": shape,
        "batches": batches,
        "paced": paced,
        "seed": seed,
        "check": check,
        "queue": tctx.Queue(),
        "consumer_done": tctx.Event(),
    }
    _run_pair(tctx, torch_producer_main, torch_consumer_main, spec, row, result, tick)
    del ctx
    return row


def run_memcpy(shape: Shape, batches: int, seed: int) -> Row:
    pool = make_pool(shape, seed)
    ring = max(POOL, math.ceil(256 * MiB / shape.batch_bytes))
    dest = [{k: np.empty_like(v) for k, v in pool[0].items()} for _ in range(ring)]
    for d in dest:  # fault every page in before timing
        for v in d.values():
            v.fill(0)
    t0 = time.perf_counter()
    for i in range(batches):
        src, dst = pool[i % POOL], dest[i % ring]
        for k, v in src.items():
            np.copyto(dst[k], v)
    seconds = time.perf_counter() - t0
    row = Row(
        f"memcpy-{shape.key}",
        "memcpy (np.copyto)",
        "copy",
        shape.label,
        shape.batch_bytes,
        batches,
        f"one thread, {POOL} source batches into a pre-faulted ring of {ring} batches "
        f"({ring * shape.batch_bytes // MiB:,} MiB); the limit",
        received=batches,
        seconds=seconds,
    )
    return row


# -- driver -------------------------------------------------------------------------------------------------


def run_arena_bench(
    base: Path,
    *,
    small_batches: int,
    large_batches: int,
    paced_batches: int,
    arena_bytes: int,
    beyond_batches: int,
    beyond_arena_bytes: int,
    torch_ref: bool,
    seed: int,
    progress: bool = True,
) -> ArenaBenchResult:
    t_start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    result = ArenaBenchResult()
    result.settings = {
        "small_batches": small_batches,
        "large_batches": large_batches,
        "paced_batches": paced_batches,
        "arena_bytes": arena_bytes,
        "beyond_batches": beyond_batches,
        "beyond_arena_bytes": beyond_arena_bytes,
        "torch": torch_ref,
        "seed": seed,
    }
    plan: list[tuple[Shape, int]] = [(SMALL, small_batches), (LARGE, large_batches)]
    n_paths = 2 if torch_ref else 1
    total = sum(n * n_paths + paced_batches * n_paths for _s, n in plan if n) + beyond_batches
    with tqdm(total=total, unit="batch", file=sys.stderr, disable=not progress) as bar:
        for shape, n in plan:
            if not n:
                continue
            bar.set_description(f"memcpy {shape.key}")
            mem = run_memcpy(shape, n, seed)
            rows = [mem]
            for paced, count in ((False, n), (True, paced_batches)):
                if not count:
                    continue
                first = not paced
                bar.set_description(f"arena {shape.key} {'paced' if paced else 'stream'}")
                rows.append(
                    run_arena_case(ctx, base, shape, count, paced, arena_bytes, seed, first, result, bar.update)
                )
                if torch_ref:
                    bar.set_description(f"torch.mp {shape.key} {'paced' if paced else 'stream'}")
                    rows.append(run_torch_case(ctx, shape, count, paced, seed, first, result, bar.update))
            for r in rows:
                r.memcpy_gbps = mem.gbps
            result.rows += rows
        if beyond_batches:
            bar.set_description(f"arena {SMALL.key} beyond the arena")
            row = run_arena_case(
                ctx,
                base,
                SMALL,
                beyond_batches,
                False,
                beyond_arena_bytes,
                seed,
                False,
                result,
                bar.update,
                beyond=True,
            )
            mem_small = result.row(f"memcpy-{SMALL.key}")
            row.memcpy_gbps = mem_small.gbps if mem_small is not None else None
            result.rows.append(row)
    log_path = base / "broker.log"
    if log_path.exists():
        result.broker_log = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    result.wall_s = time.perf_counter() - t_start
    return result


# -- report -------------------------------------------------------------------------------------------------

HEADERS = (
    "path",
    "mode",
    "batch",
    "batches",
    "GB/s",
    "vs memcpy",
    "hand-over p50 ms",
    "p99 ms",
    "from put start p50 ms",
    "copied",
    "key",
)
AIM_HEADERS = ("aim", "measured", "target", "met")


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def cells(r: Row) -> list[str]:
    ratio = f"{r.gbps / r.memcpy_gbps:.2f}x" if r.memcpy_gbps else "-"
    size = f"{r.batch_bytes / MiB:g} MiB"
    return [
        r.path,
        r.mode,
        size,
        f"{r.received:,}" + ("" if r.received == r.batches else f" of {r.batches:,}"),
        f"{r.gbps:.2f}",
        ratio,
        _fmt_ms(r.p(0.5)),
        _fmt_ms(r.p(0.99)),
        _fmt_ms(r.p(0.5, r.from_start_ms)),
        "-" if r.copied_bytes is None else f"{r.copied_bytes / (r.received * r.batch_bytes or 1):.0%}",
        r.key,
    ]


def aims(result: ArenaBenchResult) -> list[list[str]]:
    out = []
    s = result.row(f"arena-{SMALL.key}-stream")
    if s is not None:
        ok = s.gbps >= STREAM_AIM_GBPS and not s.errors and s.received == s.batches
        out.append(
            [
                f"sustained GB/s, {SMALL.batch_bytes / MiB:g} MiB batches, stream (within the arena)",
                f"{s.gbps:.2f} GB/s",
                f">= {STREAM_AIM_GBPS:g} GB/s",
                "met" if ok else "NO",
            ]
        )
    for mode in ("paced", "stream"):
        r = result.row(f"arena-{LARGE.key}-{mode}")
        p50 = r.p(0.5) if r is not None else None
        if r is not None and p50 is not None:
            out.append(
                [
                    f"hand-over p50, {LARGE.batch_bytes / MiB:g} MiB batches, {mode}",
                    f"{p50:.2f} ms",
                    f"< {HANDOVER_AIM_MS:g} ms",
                    "met" if p50 < HANDOVER_AIM_MS and not r.errors else "NO",
                ]
            )
    return out


def _notes(result: ArenaBenchResult) -> list[str]:
    s = result.settings
    notes = [
        "copied = share of the bytes the persisting consumer got as copies (read back from Lance) instead of "
        "views on the arena.",
        "GB/s = bytes received / (producer's first put starts -> consumer has the last batch), 1 GB = 1e9 bytes; "
        "vs memcpy = that / memcpy GB/s of the same batch size in this run (one copy, one thread: the arena path "
        "makes one copy too, in the producer, plus the protocol; both processes and the broker share the cores).",
        "hand-over = consumer has the batch (persisting: get_data returned the views; torch: get() returned the "
        "tensors) - the producer's put returned (persisting: after its one copy into the arena and the put_tensors "
        "round trip; torch: after the copy into shared memory, before the feeder thread pickles and sends). "
        "Per batch, aligned by batch order, time.monotonic across processes; p50/p99 nearest rank. In stream mode "
        "it includes waiting behind earlier batches; paced mode puts batch i once batch i-1 was received. A negative "
        "hand-over means the consumer had the batch before the producer's put returned (the broker makes the samples "
        "visible before its put_tensors reply reaches the producer). 'from put start' measures from the moment put "
        "was called instead (includes the producer's copy into shared memory).",
        f"Every batch is checked on receipt: its first element carries the batch number (order and content). Source "
        f"data: {POOL} random batches per producer (numpy default_rng(seed={s['seed']})), used in turn.",
        'persisting: durability="process" (the log is written, not fsynced; the background flush writes the rows to '
        "Lance meanwhile, competing for the same cores and the disk). An extent is reused only after its rows are "
        "flushed and no consumer holds views, so beyond the arena size throughput is bound by the flush (disk).",
        "TransferQueue: not measured (not installable here).",
    ]
    for r in result.rows:
        notes += [f"{r.key}: {r.path}, {r.settings}"]
        notes += [f"{r.key} ERROR: {e}" for e in r.errors]
        notes += [f"{r.key}: {n}" for n in r.notes]
    if result.broker_log:
        notes.append(f"broker log lines at WARNING or above: {len(result.broker_log)}")
        notes += [f"  {line}" for line in result.broker_log[:10]]
    notes.append(
        f"Whole run: {result.wall_s:.1f} s wall. Timings are from one run on a shared machine: compare ratios "
        "within it, not across runs."
    )
    return notes


def render_arena(result: ArenaBenchResult, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(
            {
                "meta": result.meta,
                "settings": result.settings,
                "wall_s": result.wall_s,
                "rows": [r.to_json() for r in result.rows],
                "aims": [dict(zip(AIM_HEADERS, a, strict=True)) for a in aims(result)],
                "zero_copy_checks": result.checks,
                "broker_log": result.broker_log,
            },
            indent=2,
        )
    meta = [f"{k}: {v}" for k, v in result.meta.items()]
    rows = [cells(r) for r in result.rows]
    aim_rows = aims(result)
    checks = [f"zero-copy check, {c}" for c in result.checks]
    if fmt == "console":
        parts = [*meta, "", plain_table(HEADERS, rows)]
        if aim_rows:
            parts += ["", plain_table(AIM_HEADERS, aim_rows)]
        parts += ["", *checks, "", *_notes(result)]
        return "\n".join(parts)
    if fmt != "rst":
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    parts = ["Arena benchmark", "===============", ""]
    parts += [f"- {line}" for line in meta] + ["", "Producer -> consumer", "--------------------", ""]
    parts += [rst_table(HEADERS, rows), ""]
    if aim_rows:
        parts += ["Aims", "----", "", rst_table(AIM_HEADERS, aim_rows), ""]
    parts += ["Zero-copy check", "---------------", ""] + [f"- {c}" for c in result.checks] + [""]
    parts += ["Notes", "-----", ""] + [f"- {line}" for line in _notes(result)]
    return "\n".join(parts)
