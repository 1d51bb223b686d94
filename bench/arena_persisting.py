"""The ``arena`` benchmark's persisting case: ``Queue(topic, broker=..., durability="process")``; the producer
``put``s a dict of numpy arrays (batch dim 0, ``partition_id``), the consumer calls ``get_batch(fields,
batch_size, task_name, partition_id, wait=True)`` (get_meta + get_data in one round trip, waiting in the broker):
read-only numpy views on the broker's arena. Each case gets its own broker (fresh storage, fresh arena). ``put``
returns after its one copy into the arena and the ``put_tensors`` round trip (the extent was leased ahead)."""

from __future__ import annotations

import asyncio
import faulthandler
import time
from pathlib import Path
from typing import Any

from persisting import Queue

from .arena_batches import POOL, MiB, Shape, make_pool, stamp, stamp_of
from .arena_pair import (
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
from .broker_server import broker_process
from .measure import Tick
from .workers import START_TIMEOUT_S


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
            if spec["check"] and batch_no == 0:
                report_check(spec, "persisting arena get_batch", data)
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
) -> Row:
    mode = "paced" if paced else "stream"
    key = f"arena-{shape.key}-{mode}" + ("-beyond" if beyond else "")
    row = Row.of(
        key,
        "persisting arena",
        mode,
        shape,
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
    spec = pair_spec(shape, batches, paced, seed, check, broker=address, topic="bench", put_timeout=put_timeout)
    t_stop = 0.0
    with broker_process(case / "storage", address, log_path, ["--arena-bytes", str(arena_bytes)], "WARNING"):
        run_pair(ctx, arena_producer_main, arena_consumer_main, spec, row, result, tick)
        t_stop = time.perf_counter()
    row.notes.append(f"broker stop (SIGTERM, flushes the rest to Lance) took {time.perf_counter() - t_stop:.1f} s")
    return row
