"""The ``samples`` benchmark's throughput floor: how many bare round trips per second the broker answers for as
many client processes as the workload has consumers, each calling ``hello`` back to back (no topic, no
storage, no producers). ``get_meta`` hands out each sample once and logs the take before it answers, so a
consumer pays one round trip per batch; times the batch size, this rate is the most samples per second a
workload of such consumers could take on this machine, measured in the same run as the workload.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path
from typing import Any

from bench.common.workers import START_TIMEOUT_S, gather, guarded, join_each, span, worker, write_result
from persisting.client.connection import connection

FLOOR_CALLS = 1_000  # hello round trips per process


def floor_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    guarded(spec, info, lambda: asyncio.run(_hellos(spec, info)), BaseException)
    write_result(spec["out"], info)


async def _hellos(spec: dict[str, Any], info: dict[str, Any]) -> None:
    conn = connection(spec["broker"])
    await conn.request("hello", {})  # connected before the clock starts
    spec["barrier"].wait(START_TIMEOUT_S)
    info["t0"] = time.monotonic()
    for _ in range(spec["calls"]):
        await conn.request("hello", {})
    info["t1"] = time.monotonic()


def round_trips_per_s(broker: str, processes: int, work: Path, errors: list[str]) -> float:
    """Bare ``hello`` round trips per second, ``processes`` spawned clients back to back (0.0 if one failed)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    procs = [
        worker(
            ctx,
            floor_main,
            {"broker": broker, "barrier": barrier, "calls": FLOOR_CALLS, "out": str(work / f"floor-{i}")},
            f"floor-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    errors += join_each(procs, START_TIMEOUT_S)
    found = gather(procs, lambda p: work / p.name, errors, "no result file")
    if len(found) != processes or any("error" in info for _, info, _ in found):
        return 0.0
    wall = span([info["t0"] for _, info, _ in found], [info["t1"] for _, info, _ in found])
    return processes * FLOOR_CALLS / wall if wall > 0 else 0.0
