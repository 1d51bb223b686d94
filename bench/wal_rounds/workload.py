"""The workload of ``python -m bench wal-rounds``: what one group-commit round of the write-ahead log costs beyond its
fdatasync, by how the round reaches its thread and by the GIL switch interval, with and without a thread holding the
GIL.

The broker's shape in one process: ``--writers`` coroutines on uvloop each append a frame of ``--frame-bytes`` and
await ``commit()`` (a ``durability="sync"`` put's wait), ``--commits`` times each. "busy" adds one Python thread
spinning on the GIL, standing in for the flush's Lance work in the broker's threads. The reference in the same run:
the round run with ``asyncio.to_thread`` (the code before the dedicated sync thread) at CPython's default switch
interval (5 ms). The variants run interleaved, each case in a fresh process (``python -m bench.wal_rounds.workload
HOW SWITCH_S BUSY``, its result a JSON line), ``--reps`` times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from persisting.engine.wal import WriteAheadLog

DEFAULT_SWITCH_S = 0.005  # CPython's default sys.getswitchinterval()
BROKER_SWITCH_S = 0.0005  # broker/__main__.py GIL_SWITCH_INTERVAL_S
CASES = [("to_thread", DEFAULT_SWITCH_S), ("to_thread", BROKER_SWITCH_S), ("thread", DEFAULT_SWITCH_S)]
CASES += [("thread", BROKER_SWITCH_S)]


class _ToThreadLog(WriteAheadLog):
    """The round as it was: the blocking part handed to the loop's default executor."""

    async def _sync_round(self) -> None:
        try:
            round_ = self._round_start()
            await asyncio.to_thread(self._round_sync, round_)
            self._round_done(round_)
        finally:
            self._sync_task = None


def _one(how: str, switch_s: float, busy: bool, writers: int, commits: int, frame_bytes: int) -> dict[str, float]:
    sys.setswitchinterval(switch_s)
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    async def run(folder: Path) -> dict[str, float]:
        kind = _ToThreadLog if how == "to_thread" else WriteAheadLog
        wal = kind(folder / "wal", sync=True)
        wal.rotate(0)
        blob, waits = b"x" * frame_bytes, []

        async def writer() -> None:
            for i in range(commits):
                t = time.perf_counter()
                wal.append(i, 1, ["p", {}, None], blob)
                await wal.commit()
                waits.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(writers)))
        wall = time.perf_counter() - t0
        await wal.close()
        return {"commits_per_s": writers * commits / wall, "p50_us": statistics.median(waits) * 1e6}

    spinner = threading.Thread(target=spin, daemon=True)
    if busy:
        spinner.start()
    folder = Path(tempfile.mkdtemp(prefix="wal-rounds-"))
    try:
        import uvloop

        return uvloop.run(run(folder))
    finally:
        stop.set()
        shutil.rmtree(folder, ignore_errors=True)


def case_argv(how: str, switch_s: float, busy: bool, writers: int, commits: int, frame_bytes: int) -> list[str]:
    """One case as this module's command line."""
    return [
        how,
        str(switch_s),
        str(int(busy)),
        f"--writers={writers}",
        f"--commits={commits}",
        f"--frame-bytes={frame_bytes}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wal_rounds.workload", description=__doc__.split("\n\n")[0])
    parser.add_argument("how", choices=("to_thread", "thread"))
    parser.add_argument("switch_s", type=float)
    parser.add_argument("busy", choices=("0", "1"))
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--frame-bytes", type=int, default=10_000)
    a = parser.parse_args(argv)
    print(json.dumps(_one(a.how, a.switch_s, a.busy == "1", a.writers, a.commits, a.frame_bytes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
