"""Where a 6 MiB arena put's time goes, step by step: ``python -m bench arena-steps [--batches 256] [--in-flight 1]``.

What ``python -m bench arena``'s 6 MiB stream does (one broker with a 2 GiB arena, a producer ``put``ting the
6 MiB batches, a consumer process in ``get_batch(wait=True)``), with ``perf_counter_ns`` timers wrapped around
the client's functions in the producer. Prints the median (and mean, p90) time of each step per batch; for
serial puts, put minus its copy and its round trip (the put's own Python); for puts in flight, the share of the
copy time during which another put's ``put_tensors`` request was at the broker (the overlap); and a memcpy of
the same batches in the producer right after (the copy's floor). The timers wrap functions by name: a function
renamed in the client makes this fail at start, not time something else."""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.arena.batches import POOL, SMALL, make_pool, stamp
from bench.common.broker_process import broker_process
from bench.harness import Probe
from persisting import Queue
from persisting.client import big_batches, connection, remote_tensors, tensor_puts
from persisting.client import queue as client_queue
from persisting.tensors import batches as tensor_batches
from persisting.tensors import column

ROUND_TRIP = "Connection.request (put_tensors round trip)"
COPY = "ArenaClient._write (lease + copy)"
PUT = "Queue.put (all of it)"


class Timers:
    def __init__(self) -> None:
        self.took: dict[str, list[int]] = defaultdict(list)
        self.spans: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        f = getattr(owner, name)
        took, spans = self.took[label], self.spans[label]
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def timed(*a: Any, **k: Any) -> Any:
                t = time.perf_counter_ns()
                try:
                    return await f(*a, **k)
                finally:
                    if label != ROUND_TRIP or a[1] == "put_tensors":
                        took.append(time.perf_counter_ns() - t)
                        spans.append((t, time.perf_counter_ns()))

            setattr(owner, name, timed)
        else:

            @functools.wraps(f)
            def timed_sync(*a: Any, **k: Any) -> Any:
                t = time.perf_counter_ns()
                try:
                    return f(*a, **k)
                finally:
                    took.append(time.perf_counter_ns() - t)

            setattr(owner, name, timed_sync)

    def clear(self) -> None:
        for took in self.took.values():
            took.clear()
        for spans in self.spans.values():
            spans.clear()


def _consumer(address: str, batches: int) -> None:
    async def go() -> None:
        async with Queue("bench", broker=address, durability="process") as q:
            got = 0
            while got < batches * SMALL.rows:
                data, meta = await q.get_batch(SMALL.names, SMALL.rows, "train", "p", wait=True, timeout=60)
                got += len(meta)
                del data

    asyncio.run(go())


def _instrument(timers: Timers) -> None:
    w = timers.wrap
    w(client_queue.Queue, "put", PUT)
    w(client_queue.Queue, "_put_key", "Queue._put_key (idempotency key)")
    w(column, "split", "column.split (columns of the batch)")
    w(big_batches, "above_limit", "big_batches.above_limit (larger than the budget?)")
    w(tensor_puts.TensorPuts, "_through_arena", "TensorPuts._through_arena (the mapping)")
    w(tensor_batches, "other_rows", "batches.other_rows (empty rows)")
    w(tensor_puts.codec, "pack", "codec.pack (rows blob)")
    w(tensor_batches, "layout", "batches.layout")
    w(remote_tensors.ArenaClient, "_lease", "ArenaClient._lease (the spare extent)")
    w(remote_tensors.ArenaClient, "_write", COPY)
    w(connection.Connection, "request", ROUND_TRIP)
    w(remote_tensors.ArenaClient, "put_tensors", "ArenaClient.put_tensors (copy, round trip, glue)")
    w(tensor_batches, "batch_meta", "batches.batch_meta (the BatchMeta put returns)")


async def _produce(address: str, batches: int, in_flight: int, timers: Timers) -> tuple[float, list[int]]:
    pool = make_pool(SMALL, 0)
    async with Queue("bench", broker=address, durability="process") as q:
        for i in range(4):
            await q.put(pool[i % POOL], partition_id="warm")
        timers.clear()
        t0 = time.perf_counter()
        running: list[asyncio.Future[Any]] = []
        for i in range(batches):
            batch = pool[i % POOL]
            stamp(batch, i)
            running.append(asyncio.ensure_future(q.put(batch, partition_id="p")))
            if len(running) >= in_flight:
                await running.pop(0)
        await asyncio.gather(*running)
        wall = time.perf_counter() - t0
    ring = [{k: np.empty_like(v) for k, v in pool[0].items()} for _ in range(44)]  # 264 MiB: past any cache
    for d in ring:
        for v in d.values():
            v.fill(0)
    floor = []
    for i in range(batches):
        t = time.perf_counter_ns()
        for k, v in pool[i % POOL].items():
            np.copyto(ring[i % len(ring)][k], v)
        floor.append(time.perf_counter_ns() - t)
    return wall, floor


def _overlap(copies: list[tuple[int, int]], trips: list[tuple[int, int]]) -> float:
    """The share of the copies' time during which a put_tensors request was outstanding."""
    covered = 0
    for start, end in copies:
        at = start
        for a, b in sorted((max(start, s), min(end, e)) for s, e in trips if s < end and e > start):
            a = max(a, at)
            if b > a:
                covered, at = covered + b - a, b
    total = sum(e - s for s, e in copies)
    return covered / total if total else 0.0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench arena-steps", description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=256)
    ap.add_argument("--in-flight", type=int, default=1, help=f"puts running at once, 1-{POOL}")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.in_flight <= POOL or args.batches < 1:
        raise SystemExit(f"--in-flight must be 1 to {POOL}, --batches at least 1")
    base = Path(tempfile.mkdtemp(prefix="arena-steps-"))
    address = f"ipc://{base}/b.sock"
    timers = Timers()
    _instrument(timers)
    try:
        with broker_process(base / "storage", address, base / "broker.log", ["--arena-bytes", str(2 << 30)], "WARNING"):
            consumer = multiprocessing.get_context("spawn").Process(target=_consumer, args=(address, args.batches))
            consumer.start()
            wall, floor = asyncio.run(_produce(address, args.batches, args.in_flight, timers))
            consumer.join(60)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    per_ms = wall * 1e3 / args.batches
    gbps = args.batches * SMALL.batch_bytes / wall / 1e9
    print(f"{args.in_flight} in flight, {args.batches} batches: {per_ms:.3f} ms per 6 MiB batch, {gbps:.2f} GB/s")
    print(f"  load average {os.getloadavg()[0]:.1f}")
    _line("memcpy of the same batch in the producer (the floor)", floor)
    for label, took in timers.took.items():
        if took:
            _line(label, took)
    if args.in_flight == 1:
        own = [p - c - r for p, c, r in zip(timers.took[PUT], timers.took[COPY], timers.took[ROUND_TRIP], strict=True)]
        _line("put minus its copy and its round trip", own)
    else:
        share = _overlap(timers.spans[COPY], timers.spans[ROUND_TRIP])
        print(f"  copy time with another put's put_tensors at the broker: {share:.0%}")
    return 0


def _line(label: str, took_ns: list[int]) -> None:
    median, mean = statistics.median(took_ns) / 1e6, statistics.mean(took_ns) / 1e6
    p90 = sorted(took_ns)[int(len(took_ns) * 0.9)] / 1e6
    print(f"  {label:55s} median {median:.3f} ms, mean {mean:.3f}, p90 {p90:.3f} (n={len(took_ns)})")


PROBE = Probe("arena-steps", "where a 6 MiB arena put's time goes, step by step, timers in the producer", parser, main)

if __name__ == "__main__":
    sys.exit(main())
