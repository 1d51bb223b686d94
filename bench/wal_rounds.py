"""``python -m bench wal-rounds``: what one group-commit round of the write-ahead log costs beyond its fdatasync, by
how the round reaches its thread and by the GIL switch interval, with and without a thread holding the GIL.

The broker's shape in one process: ``--writers`` coroutines on uvloop each append a frame of ``--frame-bytes`` and
await ``commit()`` (a ``durability="sync"`` put's wait), ``--commits`` times each. "busy" adds one Python thread
spinning on the GIL, standing in for the flush's Lance work in the broker's threads. The reference in the same run:
the round run with ``asyncio.to_thread`` (the code before the dedicated sync thread) at CPython's default switch
interval (5 ms). The variants run interleaved, each case in a fresh process, median of ``--reps``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench wal-rounds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=2, help="coroutines putting at once (default 2)")
    parser.add_argument("--commits", type=int, default=1000, help="commits per writer and run (default 1000)")
    parser.add_argument("--frame-bytes", type=int, default=10_000, help="bytes per frame (default 10000: 100 records)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in a child process: how,switch,busy
    args = parser.parse_args(argv)
    if args.case:
        how, switch, busy = args.case.split(",")
        print(json.dumps(_one(how, float(switch), busy == "1", args.writers, args.commits, args.frame_bytes)))
        return 0
    runs: dict[tuple[str, float, bool], list[dict[str, float]]] = {}
    for _ in range(args.reps):
        for busy in (False, True):
            for how, switch in CASES:
                cmd = [sys.executable, "-m", "bench", "wal-rounds", "--case", f"{how},{switch},{int(busy)}"]
                cmd += ["--writers", str(args.writers), "--commits", str(args.commits)]
                cmd += ["--frame-bytes", str(args.frame_bytes)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs.setdefault((how, switch, busy), []).append(json.loads(out))
    print("`" + " ".join(["python -m bench wal-rounds", *(sys.argv[1:] if argv is None else argv)]).strip() + "`\n")
    print("| round via | switch interval | GIL-busy thread | commits/s (median) | runs | wait p50 us | vs reference |")
    print("|---|---|---|---:|---|---:|---:|")
    for busy in (False, True):
        ref = statistics.median(r["commits_per_s"] for r in runs[("to_thread", DEFAULT_SWITCH_S, busy)])
        for how, switch in CASES:
            rs = runs[(how, switch, busy)]
            rate = statistics.median(r["commits_per_s"] for r in rs)
            each = ", ".join(f"{r['commits_per_s']:.0f}" for r in rs)
            p50 = statistics.median(r["p50_us"] for r in rs)
            label = "asyncio.to_thread" if how == "to_thread" else "the log's sync thread"
            print(
                f"| {label} | {switch * 1e3:g} ms | {'yes' if busy else 'no'} | {rate:.0f} | {each} | {p50:.0f} | "
                f"{rate / ref:.2f}x |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
