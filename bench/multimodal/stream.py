"""The ``stream`` part of ``python -m bench multimodal`` (``--parts stream``): a sustained stream beyond the arena,
and the memory it takes.

1. Persistence: one producer ``put``s float32 batches of 16 MiB worth ``--stream-factor`` (4) times the broker's
   arena (``--stream-arena-mib``, 256) through a broker (``durability="process"``, no consumer), then
   ``flush()``: the arena fills, so the stream runs at the speed its batches leave for Lance. GB/s = payload /
   (first put -> flush returned). One broker per case with ``PERSISTING_LANCE_ENCODERS`` = 1, 2 and every core
   (bench/common/arena_stream.py, as the ``persist`` suite runs it). Reference just before each case: the same
   bytes written to a plain file with ``os.write`` + ``os.fdatasync`` every 64 MiB.
2. Memory: one producer streams ``--memory-factor`` (20) times the arena to 3 consumer processes (tasks reward,
   reference, train; each takes every batch with ``get_batch`` and drops it). Peak RSS (VmHWM) of the broker,
   of the producer (from this case on) and of the consumers, and the most arena bytes in use (``status``,
   polled every 50 ms), each against the arena size: what each holds beyond the arena is the constant reported.

``--reps`` runs; cases alternate within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.arena_stream import BATCH_ROWS, disk_gbps, stream_batch, stream_run
from bench.common.broker_process import broker_process
from bench.common.measure import reset_peak, vm_hwm_bytes
from persisting import Queue
from persisting.client.connection import connection

MiB = 1024 * 1024
TASKS = ("reward", "reference", "train")


def _encoders(args: argparse.Namespace) -> list[int]:
    if args.encoders:
        return [int(x) for x in str(args.encoders).split(",")]
    return sorted({1, 2, os.cpu_count() or 1})


def _consumer(address: str, task: str, rows: int, out: Any) -> None:
    async def go() -> None:
        async with Queue("mem", broker=address, durability="process") as q:
            out.put(("ready", task))
            taken = 0
            while taken < rows:
                data, meta = await q.get_batch(["x"], BATCH_ROWS, task, "p", wait=True, timeout=300)
                if meta.size == 0:
                    break
                taken += meta.size
                float(data["x"][0, 0])  # read it, then drop it: the hold goes back
                del data
            out.put(("done", task, taken, vm_hwm_bytes("self")))

    asyncio.run(go())


async def _produce_watched(address: str, batch: np.ndarray, batches: int) -> tuple[float, int, int]:
    """Stream ``batches`` puts; returns (seconds, most arena bytes in use seen, this process's peak RSS)."""
    most = 0
    stop = asyncio.Event()

    async def watch() -> None:
        nonlocal most
        conn = connection(address)
        while not stop.is_set():
            with contextlib.suppress(Exception):
                arena = (await conn.request("status", {})).result.get("arena") or {}
                most = max(most, int(arena.get("used_bytes", 0)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    async with Queue("mem", broker=address, durability="process") as q:
        reset_peak()  # this process ran the stream cases before: their peak is not this case's
        watcher = asyncio.ensure_future(watch())
        t0 = time.perf_counter()
        for _ in range(batches):
            await q.put({"x": batch}, partition_id="p", timeout=300)
        seconds = time.perf_counter() - t0
        stop.set()
        await watcher
    return seconds, most, vm_hwm_bytes("self")


def _memory_run(base: Path, arena_bytes: int, batch: np.ndarray, batches: int, rep: int) -> dict[str, Any]:
    case = base / f"mem-{rep}"
    (case / "s").mkdir(parents=True)
    address = f"ipc://{case / 's' / 'b.sock'}"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    rows = batches * BATCH_ROWS
    with broker_process(
        case / "storage", address, base / "broker.log", ["--arena-bytes", str(arena_bytes)], "WARNING"
    ) as broker:
        procs = [ctx.Process(target=_consumer, args=(address, task, rows, out)) for task in TASKS]
        for p in procs:
            p.start()
        try:
            for _ in procs:
                out.get(timeout=120)
            seconds, most, producer_rss = asyncio.run(_produce_watched(address, batch, batches))
            done = [out.get(timeout=600) for _ in procs]
            broker_rss = vm_hwm_bytes(broker.pid)
        finally:
            for p in procs:
                p.join(timeout=120)
                if p.is_alive():
                    p.kill()
    return {
        "part": "stream-memory",
        "rep": rep,
        "arena_bytes": arena_bytes,
        "bytes": batch.nbytes * batches,
        "gbps": batch.nbytes * batches / seconds / 1e9,
        "arena_most_used": most,
        "broker_peak_rss": broker_rss,
        "producer_peak_rss": producer_rss,
        "consumer_peak_rss": max(d[3] for d in done),
        "all_taken": all(d[2] == rows for d in done),
    }


def run(args: argparse.Namespace, base: Path, reps: int) -> list[dict[str, Any]]:
    arena_bytes = args.stream_arena_mib * MiB
    batch = stream_batch(0)
    rows: list[dict[str, Any]] = []
    stream_batches = max(1, args.stream_factor * arena_bytes // batch.nbytes)
    memory_batches = max(1, args.memory_factor * arena_bytes // batch.nbytes)
    encoders = _encoders(args)
    for rep in range(reps):
        for n in encoders if rep % 2 == 0 else encoders[::-1]:
            os.sync()  # the previous case's dirty pages are not this one's
            disk = disk_gbps(base, batch, stream_batches)
            os.sync()
            gbps, cores = stream_run(base, n, arena_bytes, batch, stream_batches)
            rows.append(
                {"part": "stream", "rep": rep, "encoders": n, "gbps": gbps, "disk_gbps": disk, "broker_cores": cores}
            )
            rows[-1]["bytes"], rows[-1]["arena_bytes"] = batch.nbytes * stream_batches, arena_bytes
        os.sync()
        rows.append(_memory_run(base, arena_bytes, batch, memory_batches, rep))
    return rows
