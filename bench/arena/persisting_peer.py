"""The ``arena`` benchmark's persisting case: ``Queue(topic, broker=..., durability="process")``; the producer
``put``s a dict of numpy arrays (batch dim 0, ``partition_id``), the consumer calls ``get_batch(fields,
batch_size, task_name, partition_id, wait=True)`` (get_meta + get_data in one round trip, waiting in the broker):
read-only numpy views on the broker's arena. Each case gets its own broker (fresh storage, fresh arena). ``put``
returns after its one copy into the arena and the ``put_tensors`` round trip (the extent was leased ahead).

The ``persisting arena reserve`` case (``reserve=True``): the producer ``reserve``s each batch in the arena, fills
the reserved arrays from its pool with ``np.copyto`` (its one write, standing in for a GPU->host copy straight
into shared memory) and ``put``s the reservation, which copies nothing; the consumer is the same."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from bench.arena.batches import POOL, MiB, Shape, make_pool, read_all, stamp, stamp_of
from bench.arena.pair import (
    CASE_LIMIT_S,
    RECV_TIMEOUT_S,
    WARMUP,
    ArenaBenchResult,
    Row,
    pair_spec,
    report_check,
    report_failure,
    report_moved,
    run_pair,
)
from bench.common.broker_process import broker_process
from bench.common.flush_watch import FlushWatch
from bench.common.measure import Tick
from bench.common.workers import START_TIMEOUT_S
from persisting import Queue


def arena_producer_main(spec: dict[str, Any]) -> None:
    asyncio.run(_arena_producer(spec))


async def _arena_producer(spec: dict[str, Any]) -> None:
    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)  # a hang leaves its stack on stderr
    try:
        shape: Shape = spec["shape"]
        pool = make_pool(shape, spec["seed"])
        put_t, start_t, done = spec["put_t"], spec["start_t"], spec["received"]
        reserve = bool(spec.get("reserve"))
        fields = {name: ((n,), dt) for name, dt, n in shape.fields}
        q = Queue(spec["topic"], broker=spec["broker"], durability="process")
        await q.open()

        async def put(batch: dict[str, np.ndarray], partition: str, i: int) -> None:
            if not reserve:
                await q.put(batch, partition_id=partition, timeout=spec["put_timeout"])
                return
            r = await q.reserve(fields, shape.rows, partition, timeout=spec["put_timeout"])
            if not r.in_arena:
                raise RuntimeError("reserve gave plain memory, not the arena: this case would measure a copy")
            for name, arr in batch.items():
                np.copyto(r[name], arr)  # the producer's one write (a GPU->host copy in real use)
            if spec["check"] and i == 0 and partition == "p":
                report_check(spec, "persisting arena reserve, the producer's reserved arrays", dict(r.data))
            await q.put(r)

        async def timed(batch: dict[str, np.ndarray], i: int) -> None:
            start_t[i] = time.monotonic()
            await put(batch, "p", i)
            put_t[i] = time.monotonic()

        running: deque[asyncio.Task[None]] = deque()
        try:
            for i in range(WARMUP):
                await put(pool[i % POOL], "warm", i)
            spec["barrier"].wait(START_TIMEOUT_S)
            spec["t0"].value = time.monotonic()
            for i in range(spec["batches"]):
                if spec["paced"]:
                    while done.value < i:
                        await asyncio.sleep(0.001)
                    await asyncio.sleep(0.002)  # let the consumer settle into its poll
                while len(running) >= spec["in_flight"]:
                    await running.popleft()
                batch = pool[i % POOL]  # in no put still running: --in-flight <= POOL (checked)
                stamp(batch, i)
                if spec["in_flight"] == 1:
                    await timed(batch, i)  # the serial stream: each put awaited before the next starts
                else:  # puts run as tasks, started in batch order: the next one copies during the last's round trip
                    running.append(asyncio.ensure_future(timed(batch, i)))
            while running:
                await running.popleft()
        finally:
            for task in running:
                task.cancel()
            await q.aclose()
    except BaseException as exc:
        report_failure(spec, "producer", exc)


def arena_consumer_main(spec: dict[str, Any]) -> None:
    try:
        asyncio.run(_arena_consumer(spec))
    except BaseException as exc:
        report_failure(spec, "consumer", exc)


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
            if spec.get("reads"):
                read_all(data)
                now = time.monotonic()
            if spec["check"] and batch_no == 0:
                report_check(spec, spec.get("check_label", "persisting arena get_batch"), data)
            del data  # release the views: the broker may reuse the extent once it is flushed
            while samples >= (batch_no + 1) * shape.rows:
                recv_t[batch_no] = now
                batch_no += 1
                done.value = batch_no
        moved = (await q.stats())["zerocopy"]
        zero = moved["get_zero_copy_bytes"] - moved0["get_zero_copy_bytes"]
        copied = moved["get_copied_bytes"] - moved0["get_copied_bytes"]
        report_moved(spec, zero, copied)
    finally:
        await q.aclose()


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
    reserve: bool = False,
    watch_flushes: bool = False,
    reads: bool = False,
    in_flight: int = 1,
) -> Row:
    mode = "paced" if paced else "stream"
    key = f"arena-{'reserve-' if reserve else ''}{shape.key}-{mode}" + ("-beyond" if beyond else "")
    key += f"-{in_flight}-in-flight" if in_flight > 1 else ""
    how = (
        f"reserve(spec, batch_size={shape.rows}, partition_id) -> np.copyto of the pool batch into the reserved "
        "arrays (the producer's one write) -> put(reservation) (no copy)"
        if reserve
        else "put(partition_id)"
        + (f", {in_flight} puts in flight (tasks on one Queue, started in batch order)" if in_flight > 1 else "")
    )
    path = "persisting arena reserve" if reserve else "persisting arena"
    row = Row.of(
        key,
        path + (f", {in_flight} puts in flight" if in_flight > 1 else ""),
        mode,
        shape,
        batches,
        f'broker --arena-bytes {arena_bytes // MiB:,} MiB, durability="process", {how} -> '
        f"get_batch(batch_size={shape.rows}, wait=True) (one round trip)",
    )
    case = base / key
    case.mkdir()
    sock = case / "s"
    sock.mkdir()
    address = f"ipc://{sock / 'b.sock'}"
    log_path = base / "broker.log"
    spec = pair_spec(shape, batches, paced, seed, check, broker=address, topic="bench", put_timeout=put_timeout)
    spec.update(reserve=reserve, check_label=f"{row.path} get_batch", reads=reads, in_flight=in_flight)
    t_stop = 0.0
    with broker_process(case / "storage", address, log_path, ["--arena-bytes", str(arena_bytes)], "WARNING"):
        with FlushWatch(address) if watch_flushes else contextlib.nullcontext() as flushes:
            run_pair(ctx, arena_producer_main, arena_consumer_main, spec, row, result, tick)
        if flushes is not None:
            row.flushes_s = [t - spec["t0"].value for t in flushes.flushes_at]
        t_stop = time.perf_counter()
    row.notes.append(f"broker stop (SIGTERM, flushes the rest to Lance) took {time.perf_counter() - t_stop:.1f} s")
    return row
