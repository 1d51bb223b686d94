"""Plumbing of the spawned worker processes the multi-process benchmarks run: making them, the start barrier a
failed worker must break, the result files they leave, joining them and forwarding their progress.

Workers are ``spawn``-ed everywhere: Lance is not fork-safe.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.measure import Tick
from persisting import Queue

START_TIMEOUT_S = 120.0  # every worker must have opened its queue and reached the barrier by then


def worker(ctx: Any, target: Callable[[dict[str, Any]], None], spec: dict[str, Any], name: str, **kw: Any) -> Any:
    """A process of ``ctx`` that runs ``target(spec)``, not started yet."""
    return ctx.Process(target=target, args=(spec,), name=name, **kw)


def abort_barrier(barrier: Any) -> None:
    """Break the start barrier so that the others stop waiting for a worker that cannot get there."""
    with contextlib.suppress(Exception):  # already broken or passed: nothing left to release
        barrier.abort()


def guarded(
    spec: dict[str, Any], info: dict[str, Any], body: Callable[[], object], catch: type[BaseException] = Exception
) -> None:
    """Run a worker's ``body``; should it raise ``catch``, keep why in ``info["error"]`` (the worker still writes
    its result) and release the others from the start barrier."""
    try:
        body()
    except catch as exc:
        info["error"] = repr(exc)
        abort_barrier(spec["barrier"])


@contextlib.asynccontextmanager
async def queue_past_barrier(spec: dict[str, Any], info: dict[str, Any], **kw: Any) -> AsyncIterator[Queue]:
    """The worker's ``Queue(spec["topic"], broker=spec["broker"], **kw)``, opened before the start barrier so that
    opening is never timed; ``info["t0"]``: when the barrier let it go; ``info["cpu_s"]``: the process's CPU
    seconds from then to the end of the body. Closed on the way out."""
    q = Queue(spec["topic"], broker=spec["broker"], **kw)
    await q.open()
    try:
        spec["barrier"].wait(START_TIMEOUT_S)
        info["t0"] = time.monotonic()
        cpu0 = time.process_time()
        yield q
        info["cpu_s"] = time.process_time() - cpu0  # every thread of the worker, for the CPU-per-record ceiling
    finally:
        await q.aclose()


def write_result(stem: str, info: dict[str, Any], array: np.ndarray | None = None) -> None:
    """A worker's result: ``stem.json`` (``info``) and, given one, ``stem.npy`` (what it moved, for the checks)."""
    if array is not None:
        np.save(stem + ".npy", array)
    Path(stem + ".json").write_text(json.dumps(info))


def read_result(stem: Path) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """What ``write_result`` left at ``stem``; ``(None, None)`` when the worker wrote nothing."""
    try:
        info: dict[str, Any] = json.loads(Path(str(stem) + ".json").read_text())
    except FileNotFoundError:
        return None, None
    npy = Path(str(stem) + ".npy")
    return info, (np.load(npy) if npy.exists() else None)


def gather(
    procs: list[Any], stem_of: Callable[[Any], Path], errors: list[str], missing: str = "wrote no result"
) -> list[tuple[Any, dict[str, Any], np.ndarray | None]]:
    """Every worker's result, in order; its error, or ``missing`` where it left no result (then it is left out),
    goes to ``errors`` as "name: why"."""
    out = []
    for p in procs:
        info, array = read_result(stem_of(p))
        if info is None:
            errors.append(f"{p.name}: {missing}")
            continue
        if "error" in info:
            errors.append(f"{p.name}: {info['error']}")
        out.append((p, info, array))
    return out


def span(t0s: list[float], t1s: list[float]) -> float:
    """Earliest start -> latest end (``time.monotonic`` is one clock for all processes on Linux); 0 if unknown."""
    return max(t1s) - min(t0s) if t0s and t1s else 0.0


def watch(procs: list[Any], counter: Any, tick: Tick, timeout: float, seen: int = 0, interval: float = 0.2) -> int:
    """Forward the workers' shared counter to the progress bar until they all exit (or ``timeout``); the count."""
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(interval)
        now = counter.value
        tick(now - seen)
        seen = now
    tick(counter.value - seen)
    return int(counter.value)


def join_all(procs: list[Any], timeout: float) -> list[str]:
    """Join within one deadline for all, terminating stragglers; the errors to report."""
    errors = []
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()
            p.join(10)
            errors.append(f"{p.name} did not finish within {timeout:.0f} s; terminated")
        elif p.exitcode != 0:
            errors.append(f"{p.name} exited with code {p.exitcode}")
    return errors


def join_each(procs: list[Any], wait_s: float) -> list[str]:
    """Join giving each process ``wait_s``, terminating stragglers; the errors to report."""
    errors = []
    for p in procs:
        p.join(wait_s)
        if p.is_alive():
            p.terminate()
            p.join(5)
            errors.append(f"{p.name} did not finish; terminated")
        elif p.exitcode:
            errors.append(f"{p.name} exit code {p.exitcode}")
    return errors
