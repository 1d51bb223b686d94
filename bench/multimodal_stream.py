"""``python -m bench multimodal --parts stream`` (alone: ``python -m bench.multimodal_stream``): a sustained
stream beyond the arena, and the memory it takes.

1. Persistence: one producer ``put``s float32 batches of 16 MiB worth ``--stream-factor`` (4) times the broker's
   arena (``--stream-arena-mib``, 256) through a broker (``durability="process"``, no consumer), then
   ``flush()``: the arena fills, so the stream runs at the speed its batches leave for Lance. GB/s = payload /
   (first put -> flush returned). One broker per case with ``PERSISTING_LANCE_ENCODERS`` = 1, 2 and every core
   (``bench.persist.workload``'s stream run). Reference just before each case: the same bytes written to a plain
   file with ``os.write`` + ``os.fdatasync`` every 64 MiB.
2. Memory: one producer streams ``--memory-factor`` (20) times the arena to 3 consumer processes (tasks reward,
   reference, train; each takes every batch with ``get_batch`` and drops it). Peak RSS (VmHWM) of the broker,
   of the producer (from this case on) and of the consumers, and the most arena bytes in use (``status``,
   polled every 50 ms), each against the arena size: what each holds beyond the arena is the constant reported.

Median of ``--reps`` runs; cases alternate within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.broker_process import broker_process
from bench.common.measure import reset_peak, vm_hwm_bytes
from bench.persist.workload import BATCH_ROWS, _batch, _disk, _stream_run
from persisting import Queue
from persisting.client.connection import connection

MiB = 1024 * 1024
TASKS = ("reward", "reference", "train")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stream-arena-mib", type=int, default=256, help="the broker's arena, MiB (default 256)")
    parser.add_argument("--stream-factor", type=int, default=4, help="persistence: stream this many arenas")
    parser.add_argument("--memory-factor", type=int, default=20, help="memory: stream this many arenas")
    parser.add_argument("--encoders", default=None, help="comma-separated encoder counts (default 1,2,all cores)")


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


def run(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    arena_bytes = args.stream_arena_mib * MiB
    batch = _batch(0)
    rows: list[dict[str, Any]] = []
    stream_batches = max(1, args.stream_factor * arena_bytes // batch.nbytes)
    memory_batches = max(1, args.memory_factor * arena_bytes // batch.nbytes)
    encoders = _encoders(args)
    for rep in range(args.reps):
        for n in encoders if rep % 2 == 0 else encoders[::-1]:
            os.sync()  # the previous case's dirty pages are not this one's
            disk = _disk(base, batch, stream_batches)
            os.sync()
            gbps, cores = _stream_run(base, n, arena_bytes, batch, stream_batches)
            rows.append(
                {"part": "stream", "rep": rep, "encoders": n, "gbps": gbps, "disk_gbps": disk, "broker_cores": cores}
            )
            rows[-1]["bytes"], rows[-1]["arena_bytes"] = batch.nbytes * stream_batches, arena_bytes
        os.sync()
        rows.append(_memory_run(base, arena_bytes, batch, memory_batches, rep))
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    med = statistics.median
    stream = [r for r in rows if r.get("part") == "stream"]
    memory = [r for r in rows if r.get("part") == "stream-memory"]
    lines: list[str] = []
    if stream:
        arena = stream[0]["arena_bytes"]
        lines += [
            f"Sustained stream of {stream[0]['bytes'] / 1e9:.2f} GB ({stream[0]['bytes'] / arena:.0f}x the "
            f"{arena / MiB:.0f} MiB arena) into Lance through the broker (median of "
            f"{len({r['rep'] for r in stream})}; the file reference runs just before each case)",
            "",
            "| encoders | GB/s (median) | runs | file write + fdatasync GB/s (median) | ratio (median of each run's "
            "ratio) | broker CPU cores used |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for n in sorted({r["encoders"] for r in stream}):
            case = [r for r in stream if r["encoders"] == n]
            runs = ", ".join(f"{r['gbps']:.2f}" for r in case)
            lines.append(
                f"| {n} | {med(r['gbps'] for r in case):.2f} | {runs} | "
                f"{med(r['disk_gbps'] for r in case):.2f} | {med(r['gbps'] / r['disk_gbps'] for r in case):.2f}x | "
                f"{med(r['broker_cores'] for r in case):.2f} |"
            )
    if memory:
        arena = memory[0]["arena_bytes"]

        def m(key: str) -> float:
            return med(r[key] for r in memory)

        lines += [
            "",
            f"Memory while 1 producer streams {memory[0]['bytes'] / 1e9:.2f} GB ({memory[0]['bytes'] / arena:.0f}x "
            f"the arena) to 3 consumer processes (median of {len(memory)}; every consumer took every batch: "
            f"{all(r['all_taken'] for r in memory)}; {m('gbps'):.2f} GB/s)",
            "",
            "| what | peak (median) | beyond the arena |",
            "|---|---:|---:|",
            f"| arena bytes in use | {m('arena_most_used') / MiB:,.0f} MiB | (arena {arena / MiB:,.0f} MiB) |",
        ]
        for key, label in (("broker_peak_rss", "broker RSS"), ("producer_peak_rss", "producer RSS"),
                           ("consumer_peak_rss", "consumer RSS (the largest of 3)")):  # fmt: skip
            lines.append(f"| {label} | {m(key) / MiB:,.0f} MiB | {(m(key) - arena) / MiB:+,.0f} MiB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.multimodal_stream", description=__doc__.split("\n\n")[0])
    add_args(parser)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mmstream-", dir=args.dir) as tmp:
        rows = run(args, Path(tmp))
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
