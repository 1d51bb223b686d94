"""The tensor scenario of ``python -m bench chaos`` (``--tensor-kills N``): kill -9 of the broker under tensor batches
past half its arena and past the compaction threshold (issue 37).

One broker (a real subprocess) on fresh storage: an 8 MiB first segment (``--arena-bytes``), a 512 MiB budget, its
shared memory in a private folder under /dev/shm (so that other processes' files do not count), and
``compact_min_fragments = 2`` (a ``[backend_options]`` table in its TOML file) so that the bucket compacts all along.
Two producers (``tensor_worker.py``) put 6 MiB batches of 8 samples and 768 KiB batches of 1 in a seeded mix, a
consumer takes them with acknowledged delivery; the broker is SIGKILLed ``N`` times at seeded moments (0.3-1.5 s
after it was ready) and restarted each time. Then the workers stop, and everything stored is read back.

Figures that must be 0: restarts that did not get ready, restarts that could not open the topic (their log says
which), files of the killed broker still in the shared-memory folder after its restart, acknowledged samples lost,
stored twice or with other bytes, workers that failed, files in the folder after the final clean stop, payloads
kept on disk (``broker/kept.py``) at the end. Compactions seen (Lance ``Rewrite`` commits of the bucket, read while
the broker is down) must not be 0, or the run did not test what it is for.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from persisting import PersistingError, Queue
from persisting.engine import topic_dirname

from . import tensor_worker
from .workload import Broker, Tally

MiB = 1024 * 1024
ARENA_BYTES = 8 * MiB
SHM_BUDGET = 512 * MiB
UP_S = (0.3, 1.5)  # the broker runs this long after it was ready, then it is SIGKILLed
START_TRIES = 3  # starts in a row before the run gives up (each failed one is a finding)
CONFIG = "[backend_options]\ncompact_min_fragments = 2\n"
MUST_BE_ZERO = (
    "restarts that did not get ready",
    "restarts that could not open the topic",
    "killed broker's shared-memory files left after its restart",
    "topic unreadable at the end",
    "acknowledged lost",
    "duplicated",
    "samples whose bytes differ from what was put",
    "corrupt views seen by the consumer",
    "workers that failed (exit code not 0)",
    "shared-memory files left after the clean stop",
    "payloads kept on disk at the end",
    "tracebacks in the broker log",
)


def run(base: Path, kills: int, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    """The scenario under ``base`` (short: the ipc socket lives there); the figures, name -> value."""
    rng = random.Random(seed)
    seeds = [rng.randrange(2**32) for _ in range(2)]  # the producers' mixes: the same whatever the kill count
    moments = [round(rng.uniform(*UP_S), 3) for _ in range(kills)]
    say(f"tensor scenario: seed {seed}, {kills} broker kills at {moments[:5]}... s after each start")
    work = base / "t"
    work.mkdir()
    shm = Path(tempfile.mkdtemp(prefix="pch-", dir="/dev/shm"))
    try:
        return _run(work, shm, moments, seeds, say) | {"seed": seed}
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def _run(work: Path, shm: Path, moments: list[float], seeds: list[int], say: Callable[[str], None]) -> dict[str, Any]:
    (work / "broker.toml").write_text(CONFIG)
    flags = ["--arena-bytes", str(ARENA_BYTES), "--shm-budget", str(SHM_BUDGET), "--shm-dir", str(shm)]
    broker = Broker(work, [*flags, "--config", str(work / "broker.toml")])
    broker.start()
    stop = work / "stop"
    workers = [
        _spawn(broker.address, "produce", 1, seeds[0], stop),
        _spawn(broker.address, "produce", 2, seeds[1], stop),
        _spawn(broker.address, "consume", 3, 0, stop),
    ]
    t0 = time.monotonic()
    restart_s: list[float] = []
    not_ready = left = 0
    rewrites: set[str] = set()
    for k, up in enumerate(moments):
        time.sleep(up)
        before = _files(shm)
        broker.kill()
        rewrites |= _rewrites(broker.storage)
        for _ in range(START_TRIES):
            try:
                restart_s.append(broker.start())
                break
            except RuntimeError as exc:
                not_ready += 1
                say(f"restart {k + 1} did not get ready: {exc}")
        else:
            break
        now = _files(shm)
        left += sum(1 for name, inode in before.items() if now.get(name) == inode)
        if (k + 1) % 10 == 0:
            say(f"{k + 1} kills, {len(rewrites)} compactions seen, {time.monotonic() - t0:.0f} s")
    time.sleep(1.0)
    tally = Tally()
    failed = _finish(workers, stop, tally)
    try:
        stored, differ, unreadable = *asyncio.run(_read_all(broker.address)), ""
    except PersistingError as exc:  # the finding this scenario exists for: say it, do not stop at it
        stored, differ, unreadable = collections.Counter(), 0, f"{type(exc).__name__}: {exc}"
    rewrites |= _rewrites(broker.storage)
    exit_code = broker.stop()
    log = broker.log.read_text(errors="replace")
    errors = [line[:600] for line in log.splitlines() if line.startswith(("ERROR", "CRITICAL"))]
    acked = set(tally.acked)
    sizes = tally.batches
    return {
        "broker kill -9 + restart": len(restart_s),
        "broker restart s (median)": round(sorted(restart_s)[len(restart_s) // 2], 2) if restart_s else 0,
        "restarts that did not get ready": not_ready,
        "restarts that could not open the topic": log.count("could not be opened to re-adopt"),
        "killed broker's shared-memory files left after its restart": left,
        "compactions seen (Lance Rewrite commits)": len(rewrites),
        "batches of 8 / of 1 sample acknowledged": f"{sizes[tensor_worker.BIG]} / {sizes[tensor_worker.SMALL]}",
        "samples acknowledged": len(acked),
        "puts retried after BrokerUnavailableError (same key)": tally.retried,
        "topic unreadable at the end": unreadable or 0,
        "acknowledged lost": len(acked - set(stored)),
        "duplicated": sum(n - 1 for n in stored.values() if n > 1),
        "stored, never acknowledged (put killed before its answer)": len(set(stored) - acked),
        "samples whose bytes differ from what was put": differ,
        "corrupt views seen by the consumer": tally.corrupt,
        "workers that failed (exit code not 0)": len(failed),
        "shared-memory files left after the clean stop": len(list(shm.iterdir())),
        "payloads kept on disk at the end": int((broker.storage / "broker.kept").exists()),
        "broker clean stop exit code": exit_code,
        "tracebacks in the broker log": log.count("Traceback"),
        "minutes": round((time.monotonic() - t0) / 60, 1),
        "_details": [*failed, *(f"{line} (x{n})" for line, n in collections.Counter(errors).most_common(10))],
    }


def _spawn(address: str, role: str, wid: int, seed: int, stop: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bench.chaos.tensor_worker", address, role, str(wid), str(seed), str(stop)]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PERSISTING_REQUEST_TIMEOUT": "1"}  # puts caught by a restart raise and are retried
    with (stop.parent / f"worker-{wid}.err").open("wb") as err:
        return subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=err, env=env)


def _finish(procs: list[subprocess.Popen[bytes]], stop: Path, tally: Tally) -> list[str]:
    """Ask the workers to stop; the lines of those that failed."""
    stop.touch()
    failed = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        tally.read(out)
        if proc.returncode:
            role, wid = str(proc.args[4]), str(proc.args[5])  # type: ignore[index]
            err = (stop.parent / f"worker-{wid}.err").read_text(errors="replace")
            failed.append(f"{role} worker {wid} exited {proc.returncode}: {err[-1500:]}")
    return failed


async def _read_all(address: str) -> tuple[collections.Counter[int], int]:
    """Every stored sample's id (how many times each), and how many samples read back other bytes than were put."""
    stored: collections.Counter[int] = collections.Counter()
    differ = 0
    async with Queue(tensor_worker.TOPIC, broker=address, num_buckets=1) as q:
        while True:
            data, meta = await q.get_batch(["x", "id"], batch_size=64, partition_id="p", task_name="verify")
            if meta.size == 0:
                break
            ids = [int(i) for i in np.asarray(data["id"])]
            x = np.asarray(data["x"])
            differ += sum(1 for row, i in enumerate(ids) if not np.array_equal(x[row], tensor_worker.sample(i)))
            stored.update(ids)
            del data, x
    return stored, differ


def _files(folder: Path) -> dict[str, int]:
    """name -> inode of the files in ``folder`` (a file of the same name made by the next broker is another one)."""
    out = {}
    for entry in os.scandir(folder):
        try:
            out[entry.name] = entry.inode()
        except OSError:
            continue
    return out


def _rewrites(storage: Path) -> set[str]:
    """The ids of the compactions (Lance Rewrite commits) among the bucket's versions still on disk."""
    import lance

    path = storage / topic_dirname(tensor_worker.TOPIC) / "bucket-0.lance"
    if not path.exists():
        return set()
    try:
        transactions = lance.dataset(str(path)).get_transactions(recent_transactions=1000)
    except Exception:  # a dataset the next start repairs, or no version yet: nothing to count now
        return set()
    return {t.uuid for t in transactions if t is not None and isinstance(t.operation, lance.LanceOperation.Rewrite)}
