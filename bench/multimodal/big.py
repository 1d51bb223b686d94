"""The ``big`` part of ``python -m bench multimodal`` (``--parts big``): one batch of
``--big-gib`` (2) GiB through a broker whose arena is ``--big-arena-mib`` (256) MiB, 8x smaller.

A producer (this process) ``put``s one float32 batch (``BIG_SAMPLE_MIB`` per sample) into a fresh broker; a
consumer process waiting in ``get_batch`` takes it whole and has it in one tensor (the batch goes through a spool
file of the topic and comes back in pieces of at most 64 MiB: docs/concepts/batch-sizes.md). GB/s = batch bytes /
(put called -> the consumer holds every byte); the put alone and the get alone beside it. Reference in the same
run: memcpy of the same bytes (``numpy.copyto`` into a destination faulted in beforehand). After the timing the
consumer checks every byte; peak RSS (VmHWM) of the broker and of the consumer (from its first request on) show
what each held. ``--reps`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.broker_process import broker_process
from bench.common.measure import RssPoll, reset_peak, vm_hwm_bytes
from persisting import Queue

MiB = 1024 * 1024
RSS_POLL_S = 0.02  # how often the broker's RSS is read during the get
BIG_SAMPLE_MIB = 16


def _batch(nbytes: int) -> np.ndarray:
    per = BIG_SAMPLE_MIB * MiB // 4
    n = max(2, nbytes // (per * 4))
    out = np.empty((n, per), dtype=np.float32)
    for i in range(n):
        out[i] = i  # distinct per sample, cheap to make and to check
    out[:, 0] = np.arange(n, dtype=np.float32) * -1.0
    return out


def _consumer(address: str, n: int, per: int, out: Any, start: Any) -> None:
    async def go() -> None:
        async with Queue("big", broker=address) as q:
            reset_peak()  # what the interpreter and its imports took is not this batch's
            out.put(("ready", time.monotonic()))
            await asyncio.to_thread(start.wait)  # at once, or (--after-flush) once the batch is in Lance
            data, meta = await q.get_batch(["x"], n, "train", "p", wait=True, timeout=600)
            got = time.monotonic()
            x = data["x"]
            ok = meta.size == n and tuple(x.shape) == (n, per)
            for i in range(n) if ok else ():
                row = x[i]
                ok = ok and float(row[0]) == -float(i) and bool((row[1:] == i).all())
            out.put(("done", got, ok, vm_hwm_bytes("self")))

    asyncio.run(go())


async def _produce(
    address: str, batch: np.ndarray, after_flush: bool, start: Any, flushed: Callable[[], None]
) -> tuple[float, float, float]:
    async with Queue("big", broker=address) as q:
        await q.put({"x": batch[:1, :16]}, partition_id="warm")  # the topic's creation is not timed
        t0 = time.monotonic()
        await q.put({"x": batch}, partition_id="p", timeout=600)
        put_done = time.monotonic()
        if after_flush:
            await q.flush()  # the spool file goes once Lance holds the batch
            flushed()
            start.set()
            return t0, put_done, time.monotonic()  # the get alone is timed from here
        return t0, put_done, put_done


def _memcpy(batch: np.ndarray) -> float:
    dst = np.empty_like(batch)
    dst.fill(0)  # faulted in: the reference is the copy, not the page faults
    t0 = time.perf_counter()
    np.copyto(dst, batch)
    seconds = time.perf_counter() - t0
    del dst
    return batch.nbytes / seconds / 1e9


def _one(base: Path, arena_bytes: int, batch: np.ndarray, rep: int, after_flush: bool) -> dict[str, Any]:
    memcpy = _memcpy(batch)
    case = base / f"big-{rep}"
    (case / "s").mkdir(parents=True)
    address = f"ipc://{case / 's' / 'b.sock'}"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Event()
    if not after_flush:
        start.set()  # the consumer waits in get_batch while the batch is put
    with broker_process(
        case / "storage", address, base / "broker.log", ["--arena-bytes", str(arena_bytes)], "WARNING"
    ) as broker:
        consumer = ctx.Process(target=_consumer, args=(address, batch.shape[0], batch.shape[1], out, start))
        consumer.start()
        # the broker's RSS while the consumer reads (the flush's peak is not the get's)
        get_rss = RssPoll(broker.pid, RSS_POLL_S)
        try:
            out.get(timeout=120)  # the consumer is connected and waiting
            t0, put_done, asked = asyncio.run(_produce(address, batch, after_flush, start, get_rss.start))
            _kind, got, ok, consumer_rss = out.get(timeout=900)
            get_rss.stop()
            broker_rss = vm_hwm_bytes(broker.pid)
        finally:
            consumer.join(timeout=600)
            if consumer.is_alive():
                consumer.kill()
    gb = batch.nbytes / 1e9
    return {
        "part": "big",
        "after_flush": after_flush,
        "rep": rep,
        "bytes": batch.nbytes,
        "arena_bytes": arena_bytes,
        "gbps": gb / (got - t0),
        "put_gbps": gb / (put_done - t0),
        "get_gbps": gb / (got - asked) if got > asked else float("nan"),
        "memcpy_gbps": memcpy,
        "exact": bool(ok),
        "broker_peak_rss": broker_rss,
        "broker_get_peak_rss": get_rss.peak if after_flush else float("nan"),
        "broker_get_start_rss": get_rss.first if after_flush else float("nan"),
        "consumer_peak_rss": consumer_rss,
    }


def run(args: argparse.Namespace, base: Path, reps: int) -> list[dict[str, Any]]:
    batch = _batch(int(args.big_gib * 1024 * MiB))
    return [_one(base, args.big_arena_mib * MiB, batch, rep, args.after_flush) for rep in range(reps)]
