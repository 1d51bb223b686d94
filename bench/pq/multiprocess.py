"""The 2 producer + 2 consumer part of ``python -m bench pq``: four spawned processes on one ``SQLiteAckQueue`` path,
persist-queue 1.1.0 directly on the path against ``persisting.compat.persistqueue`` through a broker subprocess.

Producers ``put`` their ints one by one; consumers loop ``get(timeout=GET_TIMEOUT_S)`` + ``ack`` until
``IDLE_S`` pass without a record. The wall (the headline) runs from before the workers' spawn to their exit; each
worker also notes when it started (spawn and interpreter), had the library imported, finished its first call
(the queue's open), its last record and its end, and its CPU seconds; the broker's CPU seconds are read from
``/proc``. Only the standard library is imported at the top: a spawned worker imports this module, and what it
imports besides the library measured would be counted against both sides.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GET_TIMEOUT_S = 1.0
IDLE_S = 3.0  # a consumer stops after this long without a record
LIBRARIES = ("persist-queue", "persisting")
MAX_ERRORS = 1000  # errors of put/ack a worker retries before it gives up (and the run fails)
RESULT_WAIT_S = 600.0


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _worker(lib: str, role: str, path: str, broker: str | None, first: int, n: int, out: Any) -> None:
    marks = {"start": time.monotonic()}
    module: Any
    extra: dict[str, Any]
    if lib == "persist-queue":
        import persistqueue

        module, extra = persistqueue, {"multithreading": True}
    else:
        import persisting.compat.persistqueue as compat

        module, extra = compat, {"broker": broker, "durability": "process"}
    marks["imported"] = time.monotonic()
    got: list[int] = []
    errors: list[str] = []  # persist-queue's "database is locked" and the like: the call is made again
    opened: list[Any] = []
    while not _ok(errors, lambda _: opened.append(module.SQLiteAckQueue(path, **extra)), 0):
        pass
    q = opened[0]
    if role == "put":
        for i in range(first, first + n):
            while not _ok(errors, q.put, i):
                pass
            if i == first:
                marks["first"] = time.monotonic()
        marks["last"] = time.monotonic()
    else:
        idle = time.monotonic()
        while time.monotonic() - idle < IDLE_S:
            try:
                v = q.get(timeout=GET_TIMEOUT_S)
            except Exception:  # Empty after the timeout, or an error of the get
                marks.setdefault("first", time.monotonic())  # the open is done once a get returned
                continue
            while not _ok(errors, q.ack, v):
                pass
            got.append(v)
            idle = marks["last"] = time.monotonic()
            marks.setdefault("first", idle)
    marks["end"] = time.monotonic()
    out.put({"role": role, "got": got, "marks": marks, "cpu_s": _cpu_s(), "errors": errors})


def _ok(errors: list[str], call: Any, arg: int) -> bool:
    """Whether ``call(arg)`` returned; else its error is kept (a worker that died would hang the run)."""
    try:
        call(arg)
    except Exception as exc:
        errors.append(repr(exc))
        if len(errors) > MAX_ERRORS:
            raise
        return False
    return True


def _results(out: Any, workers: list[Any]) -> list[dict[str, Any]]:
    """Every worker's result; an error naming the worker that exited without one."""
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + RESULT_WAIT_S
    while len(results) < len(workers):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for w in workers:
                    w.terminate()
                raise RuntimeError(
                    f"a 2 + 2 worker died (exit codes {dead}) or the run passed {RESULT_WAIT_S} s"
                ) from None
    return results


def run_once(lib: str, base: Path, n: int) -> dict[str, Any]:
    """One 2 + 2 run of ``lib`` under ``base``: counts, the wall, per-phase seconds and CPU seconds."""
    if lib == "persist-queue":
        return _measured(lib, base, n, None, None)
    # imported here: a spawned worker imports this module, and only the library it measures may weigh on it
    from bench.common.broker_process import broker_process

    folder = base / f"broker-{time.monotonic_ns()}"
    (folder / "s").mkdir(parents=True)
    address = f"ipc://{folder}/s/b.sock"
    with broker_process(folder / "storage", address, folder / "broker.log", log_level="WARNING") as proc:
        return _measured(lib, base, n, address, proc.pid)


def _measured(lib: str, base: Path, n: int, broker: str | None, pid: int | None) -> dict[str, Any]:
    from bench.common.broker_process import cpu_seconds

    ctx = mp.get_context("spawn")
    path = str(base / f"mp-{lib}-{time.monotonic_ns()}")
    out = ctx.Queue()
    broker_cpu0 = cpu_seconds(pid) or 0.0
    t0 = time.monotonic()
    workers = [ctx.Process(target=_worker, args=(lib, "put", path, broker, k * n, n, out)) for k in range(2)]
    workers += [ctx.Process(target=_worker, args=(lib, "get", path, broker, 0, 0, out)) for _ in range(2)]
    for w in workers:
        w.start()
    results = _results(out, workers)
    t_results = time.monotonic()
    for w in workers:
        w.join()
    wall = time.monotonic() - t0
    broker_cpu = (cpu_seconds(pid) or 0.0) - broker_cpu0
    return _summary(results, n, t0, wall, t_results, broker_cpu)


def _summary(
    results: list[dict[str, Any]], n: int, t0: float, wall: float, t_results: float, broker_cpu: float
) -> dict[str, Any]:
    got = [v for r in results for v in r["got"]]
    distinct = set(got)
    prods = [r for r in results if r["role"] == "put"]
    cons = [r for r in results if r["role"] == "get"]
    marks = [r["marks"] for r in results]
    last_record = max(m.get("last", m["first"]) for m in (r["marks"] for r in cons))
    phases = {
        "spawn_s": max(m["start"] for m in marks) - t0,  # the last worker's interpreter up, this module imported
        "import_s": max(m["imported"] - m["start"] for m in marks),
        "open_s": max(m["first"] - m["imported"] for m in marks),  # open + first call
        "puts_s": max(m["last"] for m in (r["marks"] for r in prods)) - min(m["first"] for m in marks),
        "records_s": last_record - min(m["first"] for m in marks),  # first call anywhere to the last ack
        "tail_s": max(m["end"] for m in marks) - last_record,  # the idle rule
        "teardown_s": t0 + wall - max(m["end"] for m in marks),
        "collect_s": t0 + wall - t_results,
    }
    cpu = {
        "producers_cpu_s": sum(r["cpu_s"] for r in prods),
        "consumers_cpu_s": sum(r["cpu_s"] for r in cons),
        "broker_cpu_s": broker_cpu,
    }
    return {
        "records": 2 * n,
        "delivered": len(got),
        "twice": len(got) - len(distinct),
        "lost": 2 * n - len(distinct & set(range(2 * n))),
        "errors": sum(len(r["errors"]) for r in results),
        "wall_s": round(wall, 2),
        **{k: round(v, 2) for k, v in {**phases, **cpu}.items()},
    }


def run(base: Path, n: int, reps: int, say: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    """``reps`` rounds, the libraries alternating within each: library -> one result per round."""
    runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib in LIBRARIES}
    for r in range(reps):
        for lib in LIBRARIES:
            say(f"2 + 2 processes: {lib}, run {r + 1} of {reps}")
            runs[lib].append(run_once(lib, base, n))
    return runs
