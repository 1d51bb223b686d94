"""``python -m bench pq``: persist-queue's own benchmark workload (``benchmark/run_benchmark.py``: N items put,
then N got, per class) for persist-queue 1.1.0 and for ``persisting.compat.persistqueue`` in the same run, plus
2 producer + 2 consumer processes on one SQLiteAckQueue path (persist-queue directly on the path; the compat
layer through a broker). Per-item microseconds are the median of ``--repeat`` runs; ratio = persist-queue / ours.
The floor of a ``sync`` put is measured in the same run: a write of one log frame's bytes and its fdatasync, into
a file that grows with it and into room allocated ahead (what the write-ahead log does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from . import pq_multi

ITEM = "x" * 100
CLASSES = ("Queue", "SQLiteQueue", "FILOSQLiteQueue", "UniqueQ", "SQLiteAckQueue")
FRAME_BYTES = 160  # one put's log frame: 24 bytes of frame header, the batch header and a ~100-byte item


def _fdatasync_floor(folder: Path, n: int) -> dict[str, float]:
    """Microseconds per write + fdatasync of FRAME_BYTES (median of ``n``): growing the file, and into room."""
    frame = b"x" * FRAME_BYTES
    out = {}
    for label, ahead in (("grow_us", False), ("ahead_us", True)):
        fd = os.open(folder / f"floor-{label}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if ahead:
                os.posix_fallocate(fd, 0, n * FRAME_BYTES)
                os.fsync(fd)
            times = []
            for i in range(n):
                t0 = time.perf_counter()
                os.pwrite(fd, frame, i * FRAME_BYTES)
                os.fdatasync(fd)
                times.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
        out[label] = round(statistics.median(times) * 1e6, 1)
    return out


def _one(module: Any, cls: str, path: str, n: int, extra: dict[str, Any]) -> tuple[float, float]:
    q = getattr(module, cls)(path, **extra)
    t0 = time.perf_counter()
    for i in range(n):
        q.put(f"{ITEM}{i}")
    t1 = time.perf_counter()
    for _ in range(n):
        v = q.get()
        if cls == "Queue":
            q.task_done()
        elif cls == "SQLiteAckQueue":
            q.ack(v)
    t2 = time.perf_counter()
    if hasattr(q, "close"):
        q.close()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def run(n: int, repeat: int, mp_n: int, mp_repeat: int, parts: str = "all") -> dict[str, Any]:
    import persistqueue

    import persisting.compat.persistqueue as compat

    base = Path(tempfile.mkdtemp(prefix="pqb-"))
    rows = []
    floors = []
    try:
        for cls in CLASSES if parts != "multiprocess" else ():
            series: dict[str, list[tuple[float, float]]] = {"persist-queue": [], "process": [], "sync": []}
            for r in range(repeat):
                series["persist-queue"].append(_one(persistqueue, cls, str(base / f"pq-{cls}-{r}"), n, {}))
                for durability in ("process", "sync"):
                    path = str(base / f"ours-{durability}-{cls}-{r}")
                    series[durability].append(_one(compat, cls, path, n, {"durability": durability}))
                floors.append(_fdatasync_floor(base, min(n, 500)))
            med = {
                k: (statistics.median(p for p, _ in v), statistics.median(g for _, g in v)) for k, v in series.items()
            }
            ref = sum(med["persist-queue"])
            for name, (put_us, get_us) in med.items():
                rows.append(
                    {
                        "class": cls,
                        "library": name if name == "persist-queue" else f"persisting durability={name}",
                        "put_us": round(put_us, 1),
                        "get_us": round(get_us, 1),
                        "item_us": round(put_us + get_us, 1),
                        "vs_persist_queue": round(ref / (put_us + get_us), 2),
                    }
                )
        multi = pq_multi.run(base, mp_n, mp_repeat) if parts != "items" else None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    floor = {k: statistics.median(f[k] for f in floors) for k in ("grow_us", "ahead_us")} if floors else None
    return {"n": n, "repeat": repeat, "rows": rows, "fdatasync_floor": floor, "multiprocess": multi}


def render(result: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(result, indent=2)
    tables = []
    if result["rows"]:
        head = ["class", "library", "put us", "get us", "per item us", "persist-queue / this"]
        lines = [
            [r["class"], r["library"], r["put_us"], r["get_us"], r["item_us"], f"{r['vs_persist_queue']}x"]
            for r in result["rows"]
        ]
        tables.append((f"N={result['n']} items per class, median of {result['repeat']} runs", head, lines))
    multi = result["multiprocess"]
    if multi is not None:
        mlines, phases = pq_multi.rows(multi)
        runs = len(multi["persisting"]["wall_s_runs"])
        tables.append(
            (
                f"2 + 2 processes, {multi['persisting']['records']:,} records, median wall of {runs} runs, "
                f"persist-queue / persisting = {multi['persisting']['vs_persist_queue']}x",
                pq_multi.HEAD,
                mlines,
            )
        )
        tables.append(("seconds in the median run of each", ["phase", *multi], phases))
    out = []
    for title, h, body in tables:
        out.append(title)
        if fmt == "rst":
            out.append("| " + " | ".join(h) + " |")
            out.append("|" + "---|" * len(h))
            out += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
        else:
            out.append("  ".join(f"{c:>14}" for c in h))
            out += ["  ".join(f"{c!s:>14}" for c in row) for row in body]
        out.append("")
    floor = result["fdatasync_floor"]
    if floor is not None:
        out.append(
            f"fdatasync floor, same run (write of {FRAME_BYTES} B + fdatasync, median): {floor['grow_us']} us growing "
            f"the file, {floor['ahead_us']} us into room allocated ahead"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench pq", description=__doc__)
    parser.add_argument("--n", type=int, default=1000, help="items put then got per class and run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (the median is reported)")
    parser.add_argument("--mp-n", type=int, default=2000, help="records per producer in the multi-process case")
    parser.add_argument(
        "--mp-repeat", type=int, default=3, help="runs of the multi-process case per library, alternating (median)"
    )
    parser.add_argument(
        "--parts",
        choices=("all", "items", "multiprocess"),
        default="all",
        help="run the per-item table, the 2 producer + 2 consumer case, or both",
    )
    parser.add_argument("--format", choices=("console", "rst", "json"), default="console")
    args = parser.parse_args(argv)
    if args.n < 1 or args.repeat < 1 or args.mp_n < 1 or args.mp_repeat < 1:
        raise SystemExit("--n, --repeat, --mp-n and --mp-repeat must be at least 1")
    print(render(run(args.n, args.repeat, args.mp_n, args.mp_repeat, args.parts), args.format))
    return 0
