"""The ``arena`` benchmark: tensor batches from a producer process to a consumer process through the broker's
shared-memory arena, against a plain memcpy of the same bytes (the limit) and ``torch.multiprocessing.Queue``
(tensors in shared memory, passed as file descriptors) in the same run. This module runs the cases in order.

Every case runs in two spawned processes (Lance is not fork-safe: the ``spawn`` method everywhere), a producer and
a consumer, started and opened before a barrier so that start-up is never timed. ``time.monotonic`` is one clock
for all processes on Linux: the producer writes the time each ``put`` returned into a shared array (per batch),
the consumer the time it held each batch's views; hand-over latency = receive time - put-return time, aligned by
batch order (``arena_pair``).

- ``persisting arena`` (``arena_persisting``): ``put`` a dict of numpy arrays, ``get_batch(..., wait=True)``
  returns read-only views on the broker's arena; one broker per case.
- ``persisting arena, N puts in flight`` (``arena_persisting``, stream mode, ``--in-flight N``, default 2): the
  same producer keeping N ``put``s running as tasks on its one ``Queue``, so that batch i+1's copy into the arena
  runs during batch i's ``put_tensors`` round trip; the same consumer (it checks every batch's order).
- ``persisting arena reserve`` (``arena_persisting``, stream mode): the producer ``reserve``s each batch in the
  arena, ``np.copyto``s its pool batch into the reserved arrays (the one write, where a GPU->host copy would go)
  and ``put``s the reservation (no copy); the same consumer.
- ``torch.multiprocessing.Queue`` (``arena_torch``): the same batches copied into shared-memory tensors.
- ``TransferQueue 0.1.11`` (``arena_transferqueue``, the ``transferqueue`` extra): the same batches through its
  controller and a storage unit on a small local Ray, run after every other case (Ray is up only meanwhile).
- ``consumer ... view`` (``arena_views``): what a consumer's copy-on-write view costs against the shared mapping
  consumers used before, in this process, without the pipeline (the view itself, and reading every byte).
- ``memcpy``: ``np.copyto`` of the same batches into a preallocated, pre-faulted destination ring (larger than any
  cache), one thread, in this process: the bandwidth bound of one copy.

Two modes per path: ``stream`` (the producer puts as fast as it can: GB/s = bytes / (first put starts -> last
batch received); latency includes queueing behind earlier batches) and ``paced`` (the producer waits for the
consumer to have batch i-1 before it puts batch i: the hand-over latency of an idle pipe).
"""

from __future__ import annotations

import math
import multiprocessing
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.arena.batches import LARGE, POOL, SMALL, MiB, Shape, make_pool
from bench.arena.pair import ArenaBenchResult, Row
from bench.arena.persisting_peer import run_arena_case
from bench.arena.torch_peer import run_torch_case
from bench.arena.transferqueue_peer import run_tq_case
from bench.arena.views import run_view_cost
from bench.common.broker_process import log_lines
from bench.common.measure import SYNC_EVERY_BYTES, Tick, synced_write_s
from bench.common.tq_cluster import tq_cluster, tq_missing


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
    return Row.of(
        f"memcpy-{shape.key}",
        "memcpy (np.copyto)",
        "copy",
        shape,
        batches,
        f"one thread, {POOL} source batches into a pre-faulted ring of {ring} batches "
        f"({ring * shape.batch_bytes // MiB:,} MiB); the limit",
        received=batches,
        seconds=seconds,
    )


def run_fdatasync(base: Path, shape: Shape, batches: int, seed: int) -> Row:
    """The disk's limit for what the beyond-the-arena run must persist: the same bytes written to a plain file
    on the same filesystem as the broker's storage (``measure.synced_write_s``)."""
    pool = make_pool(shape, seed)
    chunks = (v.reshape(-1).view(np.uint8).data for i in range(batches) for v in pool[i % POOL].values())
    seconds = synced_write_s(base / "fdatasync-reference.bin", chunks)
    return Row.of(
        f"fdatasync-{shape.key}",
        "file write + fdatasync",
        "disk",
        shape,
        batches,
        f"os.write of each batch's arrays to one file beside the broker's storage, os.fdatasync every "
        f"{SYNC_EVERY_BYTES // MiB} MiB and at the end; the disk's limit for the beyond-the-arena run",
        received=batches,
        seconds=seconds,
    )


def run_tq_cases(ctx: Any, plan: list[tuple[Shape, int]], paced_batches: int, seed: int, result: ArenaBenchResult,
                 tick: Tick) -> None:  # fmt: skip
    """TransferQueue's rows, after every other case: Ray runs only while they do. Each shape's rows take the
    memcpy reference of that shape measured earlier in this run."""
    try:
        with tq_cluster() as address:
            for shape, n in plan:
                for paced, count in ((False, n), (True, paced_batches)):
                    if n and count:
                        row = run_tq_case(ctx, address, shape, count, paced, seed, not paced, result, tick)
                        mem = result.row(f"memcpy-{shape.key}")
                        row.memcpy_gbps = mem.gbps if mem is not None else None
                        result.rows.append(row)
    except Exception as exc:  # Ray or TransferQueue would not start: the other rows stand, the note says why
        result.settings["transferqueue"] = f"failed: {exc!r}"


@dataclass(slots=True)
class _Run:
    """One invocation's settings and its result, and the cases it runs for one batch shape."""

    ctx: Any
    base: Path
    seed: int
    result: ArenaBenchResult
    bar: Any
    arena_bytes: int
    paced_batches: int
    torch_ref: bool
    plot: bool
    consumer_reads: bool
    in_flight: int

    def shape(self, shape: Shape, n: int) -> None:
        """memcpy and the view costs of ``n`` batches of ``shape``, then every path streamed and paced."""
        self.bar.set_description(f"memcpy {shape.key}")
        mem = run_memcpy(shape, n, self.seed)
        rows = [mem, *run_view_cost(shape, n, self.seed)]
        for paced, count in ((False, n), (True, self.paced_batches)):
            if count:
                rows += self._cases(shape, count, paced)
        for r in rows:
            r.memcpy_gbps = mem.gbps
        self.result.rows += rows

    def _cases(self, shape: Shape, count: int, paced: bool) -> list[Row]:
        first = not paced  # zero-copy evidence once per shape and path, from the stream run
        self.bar.set_description(f"arena {shape.key} {'paced' if paced else 'stream'}")
        # the stream with puts one after another, with in_flight running at once, and written in place (reserve);
        # a paced run only the first way
        variants = [(1, False), *([(self.in_flight, False)] if self.in_flight > 1 else []), (1, True)]
        rows = []
        for flight, reserve in variants if not paced else [(1, False)]:
            if flight > 1 or reserve:
                what = f"{flight} in flight" if flight > 1 else "reserve"
                self.bar.set_description(f"arena {shape.key} stream, {what}")
            case = run_arena_case(
                self.ctx, self.base, shape, count, paced, self.arena_bytes, self.seed, first and flight == 1,
                self.result, self.bar.update, reserve=reserve, watch_flushes=self.plot, reads=self.consumer_reads,
                in_flight=flight,
            )  # fmt: skip
            rows.append(case)
        if self.torch_ref:
            self.bar.set_description(f"torch.mp {shape.key} {'paced' if paced else 'stream'}")
            rows.append(
                run_torch_case(shape, count, paced, self.seed, first, self.result, self.bar.update, self.consumer_reads)
            )
        return rows

    def beyond(self, batches: int, arena_bytes: int) -> None:
        """6 MiB batches through an arena smaller than the stream, and the disk's fdatasync of the same bytes."""
        self.bar.set_description(f"arena {SMALL.key} beyond the arena")
        row = run_arena_case(
            self.ctx, self.base, SMALL, batches, False, arena_bytes, self.seed, False, self.result, self.bar.update,
            beyond=True, watch_flushes=self.plot,
        )  # fmt: skip
        mem_small = self.result.row(f"memcpy-{SMALL.key}")
        row.memcpy_gbps = mem_small.gbps if mem_small is not None else None
        self.result.rows.append(row)
        self.bar.set_description(f"fdatasync {SMALL.key}")
        disk = run_fdatasync(self.base, SMALL, batches, self.seed)
        disk.memcpy_gbps = row.memcpy_gbps
        self.result.rows.append(disk)


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
    tq_ref: bool = True,
    progress: bool = True,
    plot: bool = False,
    consumer_reads: bool = False,
    in_flight: int = 2,
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
        "transferqueue": (tq_missing() if tq_ref else "not measured: --no-transferqueue") or "measured",
        "seed": seed,
        "consumer_reads": consumer_reads,
        "in_flight": in_flight,
    }
    plan: list[tuple[Shape, int]] = [(SMALL, small_batches), (LARGE, large_batches)]
    tq_on = result.settings["transferqueue"] == "measured"
    n_paths = (2 if torch_ref else 1) + tq_on
    extra = 1 + (in_flight > 1)  # reserve, and the in-flight stream
    total = sum(n * (n_paths + extra) + paced_batches * n_paths for _s, n in plan if n) + beyond_batches
    with tqdm(total=total, unit="batch", file=sys.stderr, disable=not progress) as bar:
        run = _Run(ctx, base, seed, result, bar, arena_bytes, paced_batches, torch_ref, plot, consumer_reads, in_flight)
        for shape, n in plan:
            if n:
                run.shape(shape, n)
        if beyond_batches:
            run.beyond(beyond_batches, beyond_arena_bytes)
        if tq_on:
            bar.set_description("TransferQueue (Ray)")
            run_tq_cases(ctx, plan, paced_batches, seed, result, bar.update)
    result.broker_log = log_lines(base / "broker.log")
    result.wall_s = time.perf_counter() - t_start
    return result
