"""``python -m bench chaos [--trials 100] [--frames 10000] [--seed N] [--dir DIR]``: kill -9 at random moments.

One broker (a real subprocess with an arena) on fresh storage, then four phases, each seeded (the seeds are
in the report; ``--seed`` replays a run's schedule, not its timing):

1. producers: ``--trials`` producer processes (bench/chaos/worker.py), two at a time, each SIGKILLed after a
   random 0.2-2.5 s (while importing, connecting, between puts or inside one);
2. consumers: ``--trials`` consumer processes taking tensor batches with acknowledged delivery, holding zero-copy
   views, SIGKILLed the same way, while one producer keeps putting;
3. broker: ``--trials`` SIGKILLs of the broker itself at random moments under two producers and a consumer (their
   request timeout is short, so some puts raise ``BrokerUnavailableError`` and are retried with its key), each
   followed by a restart;
4. fuzz: ``--frames`` seeded random frames at the broker's socket (persisting/testing/wire_fuzz.py).

Then: a drain consumer takes what is left, and the figures are counted from what the workers printed and what the
broker stores: acknowledged puts lost and stored twice, samples never acknowledged by a consumer, samples
acknowledged twice, arena bytes still leased and holds still open (the broker's ``status``), ``/dev/shm`` files
left after the broker's clean stop, and broker log bytes per bad frame.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.broker_process import _await_ready
from persisting import Queue
from persisting.client import connection
from persisting.tensors.arena import default_path
from persisting.testing import wire_fuzz

from . import worker

ARENA_BYTES = 32 * 1024 * 1024
KILL_AFTER_S = (0.2, 2.5)  # a client is SIGKILLed this long after it was started
BROKER_UP_S = (0.05, 0.8)  # the broker runs this long between two SIGKILLs
CLIENT_REQUEST_TIMEOUT_S = "1"  # shorter than most restarts: puts then raise BrokerUnavailableError and retry
DRAIN_TIMEOUT_S = 60.0


@dataclass
class Tally:
    acked: collections.Counter[int] = field(default_factory=collections.Counter)  # put acknowledged
    got: collections.Counter[int] = field(default_factory=collections.Counter)  # handed to a consumer
    done: collections.Counter[int] = field(default_factory=collections.Counter)  # consumer acknowledged
    corrupt: int = 0
    retried: int = 0  # puts that raised BrokerUnavailableError and were sent again with its key
    failed: list[str] = field(default_factory=list)  # workers asked to stop that exited with an error
    killed: collections.Counter[str] = field(default_factory=collections.Counter)
    batches: collections.Counter[int] = field(default_factory=collections.Counter)  # acknowledged puts by size

    def read(self, out: bytes) -> None:
        for line in out.decode(errors="replace").splitlines():
            word, *ids = line.split()
            if word == "CORRUPT":
                self.corrupt += 1
            elif word == "RETRY":
                self.retried += 1
            if word == "ACK":
                self.batches[len(ids)] += 1
            table = {"ACK": self.acked, "GOT": self.got, "DONE": self.done}.get(word)
            if table is not None and all(i.isdigit() for i in ids):
                table.update(int(i) for i in ids)


class Broker:
    def __init__(self, base: Path, flags: list[str] | None = None) -> None:
        self.flags = ["--arena-bytes", str(ARENA_BYTES)] if flags is None else flags
        self.storage = base / "storage"
        (base / "s").mkdir()
        self.address = f"ipc://{base}/s/b.sock"
        self.log = base / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "broker", "--storage-path", str(self.storage), "--socket", self.address]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([*cmd, *self.flags], stdout=subprocess.PIPE, stderr=log)
        _await_ready(self.proc, deadline=time.monotonic() + 60)
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def stop(self) -> int:
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=120)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code


def _spawn(address: str, role: str, wid: int, stop: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A worker; its stderr goes to ``worker-<wid>.err`` beside ``stop`` (read when it fails)."""
    cmd = [sys.executable, "-m", "bench.chaos.worker", address, role, str(wid), str(stop)]
    root = Path(__file__).resolve().parents[2]
    with (stop.parent / f"worker-{wid}.err").open("wb") as err:
        return subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=err, env={**os.environ, **(env or {})})


def _kill_clients(address: str, role: str, trials: int, rng: random.Random, tally: Tally, base: Path) -> None:
    """``trials`` clients of ``role``, two at a time, each SIGKILLed after a random while."""
    stop = base / f"never-{role}"  # these are killed, never stopped
    first = 1000 if role == "produce" else 2000
    for pair in range(0, trials, 2):
        procs = [
            (_spawn(address, role, first + t, stop), rng.uniform(*KILL_AFTER_S))
            for t in range(pair, min(trials, pair + 2))
        ]
        t0 = time.monotonic()
        for proc, after in sorted(procs, key=lambda p: p[1]):
            time.sleep(max(0.0, t0 + after - time.monotonic()))
            proc.send_signal(signal.SIGKILL)
        for proc, _after in procs:
            out, _ = proc.communicate(timeout=60)
            tally.read(out)
            tally.killed[role] += 1


def _finish(procs: list[subprocess.Popen[bytes]], stop: Path, tally: Tally) -> int:
    """Ask background workers to stop; returns how many had to be killed."""
    stop.touch()
    stuck = 0
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            stuck += 1
        tally.read(out)
        if proc.returncode:  # a worker asked to stop exits 0; anything else is a finding
            role, wid = str(proc.args[4]), str(proc.args[5])  # type: ignore[index]
            err = (stop.parent / f"worker-{wid}.err").read_text(errors="replace")
            tally.failed.append(f"{role} worker {wid} exited {proc.returncode}: {err[-1500:]}")
    return stuck


async def _drain(address: str, tally: Tally) -> None:
    """Take (with acknowledgement) every tensor sample no consumer acknowledged, until the broker counts every
    sample consumed: leases of killed consumers end at once (their process is gone), a take whose answer a killed
    broker lost comes back when its lease ends."""
    async with Queue(worker.TENSORS_TOPIC, broker=address) as q:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            data, meta = await q.get_batch(["id"], batch_size=256, partition_id="p", task_name="train", delivery="ack")
            if meta.size == 0:
                train = (await q.partitions()).get("p", {}).get("tasks", {}).get("train", {})
                if train.get("leased", 1) == 0 and train.get("consumed") == (await q.partitions())["p"]["samples"]:
                    break
                await asyncio.sleep(0.5)
                continue
            tally.done.update(int(i) for i in data["id"])
            del data
            await q.mark_consumed("train", meta, partition_id="p")
        await asyncio.sleep(0.2)  # the release of the last views goes out on this loop before it closes


def _is_tensor_id(i: int) -> bool:
    return (i // worker.SAMPLES_PER_PUT) % 2 == 1  # producers alternate: odd puts are tensor batches


async def _stored(address: str) -> collections.Counter[int]:
    stored: collections.Counter[int] = collections.Counter()
    for topic in (worker.RECORDS_TOPIC, worker.TENSORS_TOPIC):
        async with Queue(topic, broker=address) as q:
            async for rows in q.stream():
                stored.update(int(r["id"]) for r in rows)
    return stored


async def _train(address: str) -> dict[str, int]:
    """What the broker says task "train" consumed and holds leased in the tensor topic's partition."""
    async with Queue(worker.TENSORS_TOPIC, broker=address) as q:
        part = (await q.partitions()).get("p", {})
    return {"samples": part.get("samples", 0), **part.get("tasks", {}).get("train", {"consumed": 0, "leased": 0})}


async def _status(address: str) -> dict[str, Any]:
    return dict((await connection.connection(address).request("status", {})).result)


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("persisting")}


def _orphans(names: list[str]) -> list[str]:
    """Those of ``names`` still in /dev/shm that no live process maps (others on the machine make their own)."""
    mapped = ""
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped += maps.read_text()
        except OSError:
            continue  # the process ended, or is not ours to read
    return [n for n in names if Path("/dev/shm", n).exists() and n not in mapped]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(base: Path, trials: int, frames: int, seed: int, say: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """The four phases under ``base`` (a short path: the broker's ipc socket lives under it), then the figures
    (name -> value; ``_details``: the failed workers' and unanswered frames' lines)."""
    rng = random.Random(seed)
    fuzz_seed = rng.randrange(2**32)
    say(f"seed {seed} (fuzz seed {fuzz_seed}), {trials} trials per phase, {frames} fuzzed frames")
    shm_before = _shm()
    broker = Broker(base)
    broker.start()
    tally = Tally()
    t0 = time.monotonic()
    stuck, restart_s = _kill_phases(broker, trials, rng, tally, base, say)
    figures = _after(broker, tally, frames, fuzz_seed, shm_before)
    return {
        "seed": seed,
        "fuzz seed": fuzz_seed,
        "minutes": round((time.monotonic() - t0) / 60, 1),
        "producers killed": tally.killed["produce"],
        "consumers killed": tally.killed["consume"],
        "broker kill -9 + restart": tally.killed["broker"],
        # one run's figure over its restarts (chaos runs once; its table is text, no reference)
        "broker restart s (median)": round(sorted(restart_s)[len(restart_s) // 2], 2) if restart_s else 0,
        "workers that did not stop when asked": stuck,
        **figures,
    }


def _kill_phases(
    broker: Broker, trials: int, rng: random.Random, tally: Tally, base: Path, say: Callable[[str], None]
) -> tuple[int, list[float]]:
    """Producers, consumers, then the broker killed ``trials`` times each: (workers stuck, restart seconds)."""
    _kill_clients(broker.address, "produce", trials, rng, tally, base)
    say(f"producers: {tally.killed['produce']} killed, {len(tally.acked)} samples acknowledged")

    stop = base / "stop-consumers"
    feeder = [_spawn(broker.address, "produce", 3000, stop)]
    _kill_clients(broker.address, "consume", trials, rng, tally, base)
    stuck = _finish(feeder, stop, tally)
    say(f"consumers: {tally.killed['consume']} killed, {len(tally.done)} samples acknowledged by them")

    stop = base / "stop-broker-phase"
    env = {"PERSISTING_REQUEST_TIMEOUT": CLIENT_REQUEST_TIMEOUT_S}
    background = [
        _spawn(broker.address, r, w, stop, env) for r, w in (("produce", 4000), ("produce", 4001), ("consume", 4002))
    ]
    restart_s = []
    for _ in range(trials):
        time.sleep(rng.uniform(*BROKER_UP_S))
        broker.kill()
        tally.killed["broker"] += 1
        restart_s.append(broker.start())
    time.sleep(1.0)
    stuck += _finish(background, stop, tally)
    say(f"broker: {tally.killed['broker']} kill -9 + restarts")
    return stuck, restart_s


def _after(broker: Broker, tally: Tally, frames: int, fuzz_seed: int, shm_before: set[str]) -> dict[str, Any]:
    """Drain, count what is stored and held, fuzz, stop the broker cleanly: the figures."""
    asyncio.run(_drain(broker.address, tally))
    stored = asyncio.run(_stored(broker.address))
    train = asyncio.run(_train(broker.address))
    time.sleep(3.0)  # the reaper (every second) frees what dead clients held
    status = asyncio.run(_status(broker.address))
    log_before = broker.log.stat().st_size
    fz = wire_fuzz.send(broker.address, fuzz_seed, frames)
    alive = broker.proc is not None and broker.proc.poll() is None
    exit_code = broker.stop()
    log_bytes = broker.log.stat().st_size - log_before
    tracebacks = broker.log.read_text(errors="replace").count("Traceback")
    left = sorted(_shm() - shm_before)
    acked, tensor_acked = set(tally.acked), {i for i in tally.acked if _is_tensor_id(i)}
    arena = status.get("arena", {})
    return {
        "samples acknowledged to producers": len(acked),
        "puts retried after BrokerUnavailableError (same key)": tally.retried,
        "acknowledged lost": len(acked - set(stored)),
        "duplicated": sum(n - 1 for n in stored.values() if n > 1),
        "stored, never acknowledged (put killed before its answer)": len(set(stored) - acked),
        "tensor samples stored": train["samples"],
        "tensor samples not consumed after the drain (broker's count)": train["samples"] - train["consumed"],
        "tensor samples still leased after the drain": train["leased"],
        "acknowledged tensor samples no consumer took": len(tensor_acked - set(tally.got) - set(tally.done)),
        "tensor samples a killed consumer took, its DONE line lost": len(tensor_acked - set(tally.done)),
        "tensor samples acknowledged twice by consumers": sum(1 for i in tensor_acked if tally.done[i] > 1),
        "corrupt views seen by consumers": tally.corrupt,
        "workers that failed (exit code not 0)": len(tally.failed),
        "arena bytes leaked (leased_bytes)": arena.get("leased_bytes"),
        "arena holds left open": arena.get("holds"),
        "arena leases left open": arena.get("leased_extents"),
        "/dev/shm files left (new since the start, mapped by no live process)": len(_orphans(left)),
        "/dev/shm files new since the start (any process on the machine)": ", ".join(left) or "none",
        "this broker's arena file left": default_path(broker.storage).exists(),
        "fuzzed frames": fz.frames,
        "frames without a reply": len(fz.missing),
        "error replies": fz.error_replies,
        "broker alive after fuzz": alive,
        "broker clean stop exit code": exit_code,
        "log bytes per bad frame": round(log_bytes / max(fz.error_replies, 1), 2),
        "tracebacks in the broker log": tracebacks,
        "_details": [*tally.failed, *(f"no reply to fuzz frame: {f}" for f in fz.missing_frames)],
    }
