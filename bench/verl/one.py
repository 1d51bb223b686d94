"""One run of one backend of ``python -m bench verl``, in this process (the trainer): ``--steps`` steps after a
warm-up with ``--workers`` rollout processes, then the peak RSS of every process of the run by role. The suite
starts it as ``python -m bench.verl.one BACKEND ...`` in a fresh process per run (its last line: the result as
JSON); run it so by hand to profile one backend (``py-spy record --subprocesses -- python -m bench.verl.one
persisting --steps 40``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common.tq_cluster import tq_cluster

from .step import backend_module, dispatch, rollout_worker, train_step

BACKENDS = ("persisting", "transferqueue")
STEP_WAIT_S = 300  # a rollout worker's answer


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The step's shape: the suite's flags and this module's."""
    p.add_argument("--workers", type=int, default=2, help="rollout worker processes (default 2, 1+)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step, over all workers (default 16)")
    p.add_argument("--n", type=int, default=4, help="responses per prompt (default 4)")
    p.add_argument("--dp", type=int, default=2, help="trainer data-parallel ranks reading their share (default 2)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per run, after one warm-up (default 5)")
    p.add_argument("--arena-mib", type=int, default=256, help="persisting broker's arena, MiB (default 256)")


def workload_argv(args: argparse.Namespace) -> list[str]:
    """``args``'s step shape as this module's command line (and the seed)."""
    out = [f"--seed={args.seed}"]
    for name in ("workers", "prompts", "n", "dp", "steps", "arena_mib"):
        out.append(f"--{name.replace('_', '-')}={getattr(args, name)}")
    return out


@contextlib.contextmanager
def _backend(backend: str, args: argparse.Namespace, workdir: Path) -> Iterator[tuple[Any, str, int | None]]:
    """The backend started: (its module, the address workers attach to, the broker's pid)."""
    tq = backend_module(backend)
    if backend == "transferqueue":
        with tq_cluster() as attach:
            yield tq, attach, None
        return
    os.environ["XDG_RUNTIME_DIR"] = str(workdir / "run")
    tq.init({"persisting": {"storage_path": str(workdir / "data"), "arena_bytes": args.arena_mib << 20}})
    try:
        yield tq, "", tq.interface._plane.proc.pid
    finally:
        tq.close()


def run_one(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One run of ``backend``: the mean step, rollout and trainer seconds, and the peak RSS per role."""
    ctx = mp.get_context("spawn")
    per_worker = args.prompts // args.workers
    with _backend(backend, args, workdir) as (tq, attach, broker_pid):
        inboxes = [ctx.Queue() for _ in range(args.workers)]
        outbox = ctx.Queue()
        procs = [
            ctx.Process(
                target=rollout_worker, args=(backend, w, attach, per_worker, args.n, args.seed, inboxes[w], outbox)
            )
            for w in range(args.workers)
        ]
        try:
            for p in procs:
                p.start()
            pids = {outbox.get(timeout=STEP_WAIT_S)[2] for _ in procs}
            times = _steps(tq, args, inboxes, outbox, per_worker)
            return {**times, "peak_rss_mib": _peaks(broker_pid, pids)}
        finally:
            for box in inboxes:
                box.put(None)
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()


def _expect(outbox: Any, word: str, count: int) -> None:
    for _ in range(count):
        got = outbox.get(timeout=STEP_WAIT_S)
        if got[0] != word:
            raise RuntimeError(f"a rollout worker answered {got!r}, expected {word!r}")


def _steps(tq: Any, args: argparse.Namespace, inboxes: list[Any], outbox: Any, per_worker: int) -> dict[str, float]:
    times: list[float] = []
    rollout_s: list[float] = []
    train_s: list[float] = []
    for step in range(args.steps + 1):
        for box in inboxes:
            box.put(step)
        _expect(outbox, "made", len(inboxes))
        t0 = time.perf_counter()
        dispatch(tq, step, args.workers, per_worker)  # the trainer puts the step's prompts (pending)
        for box in inboxes:
            box.put("go")
        _expect(outbox, "done", len(inboxes))
        t1 = time.perf_counter()
        got = train_step(tq, args.dp)
        t2 = time.perf_counter()
        if got != per_worker * args.workers * args.n:
            raise RuntimeError(f"step {step} saw {got} trajectories")
        if step:  # the first step warms up
            times.append(t2 - t0)
            rollout_s.append(t1 - t0)
            train_s.append(t2 - t1)
    # the mean over one run's steps: the run's figure (the suite takes the median over runs)
    return {
        "step_s": statistics.mean(times),
        "rollout_s": statistics.mean(rollout_s),
        "train_s": statistics.mean(train_s),
    }


def _peaks(broker_pid: int | None, workers: set[int]) -> dict[str, float]:
    """Peak RSS (MiB) per role of every process of the run: summed, but the rollout workers' (the largest)."""
    peaks: dict[str, float] = {}
    for pid in sorted(set(_descendants(os.getpid())) | ({broker_pid} if broker_pid else set())):
        found = _peak_rss_mib(pid)
        if found is None:
            continue
        role = _role(found[0], broker_pid, pid, workers)
        if role == "rollout worker":
            key = f"{role} (max of each)"
            peaks[key] = max(peaks.get(key, 0.0), found[1])
        else:
            peaks[role] = peaks.get(role, 0.0) + found[1]
    return peaks


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _peak_rss_mib(pid: int) -> tuple[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return cmd, int(line.split()[1]) / 1024
    return None


def _role(cmd: str, broker: int | None, pid: int, workers: set[int]) -> str:
    if pid == os.getpid():
        return "trainer"
    if pid in workers:
        return "rollout worker"
    if pid == broker or "TransferQueueController" in cmd or "SimpleStorageUnit" in cmd:
        return "data plane"
    if "ray" in cmd or "gcs_server" in cmd or "raylet" in cmd:
        return "Ray (TransferQueue needs it)"
    return "other"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.verl.one", description=__doc__.split("\n\n")[0])
    p.add_argument("backend", choices=BACKENDS)
    add_workload_args(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    p.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pvb-", dir=args.dir) as work:
        print(json.dumps(run_one(args.backend, args, Path(work))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
