"""The ``broker`` benchmark: persisting through ``persisting-broker`` against the raw ZeroMQ round trip it rides
on, and a 2-producer / 2-consumer workload through the broker against persist-queue's ``SQLiteAckQueue`` shared
by the same four processes.

Everything runs in one invocation: the benchmark starts its own broker (a subprocess on a temp storage folder and
an ipc socket under /tmp) and its own ZeroMQ echo server (a spawned process), and stops both at the end. Worker
processes are started with the ``spawn`` method (Lance is not fork-safe) and all wait on one barrier after
opening their queue, so start-up is never timed. ``time.monotonic`` is one clock for every process on Linux, so
the aggregate windows below span from the earliest worker start to the latest worker end.

1. Latency: one ~100-byte record per request, sequential, the five series interleaved in rounds so that they
   share the machine's noise: raw DEALER->ROUTER echo (blocking pyzmq client, the floor), the same with a
   ``zmq.asyncio`` client, persisting's protocol ``hello`` (client Connection + broker dispatch, no storage), and
   ``Queue.put`` with ``durability="process"`` and ``"sync"``.
2. Throughput: 2 producers ``put_batch`` 100 records at a time, 2 consumers split the index space in pages of
   one batch (consumer c reads pages c, c+2, ... with ``stream(wait=True)``), so every record is read exactly once;
   counts, duplicates, losses and per-producer order are checked from (index, id) pairs.
3. The same 2x2 shape through ``persistqueue.SQLiteAckQueue(path, multithreading=True)`` opened by each process
   on one shared path: ``put`` per record, ``get(block=False)`` + ``ack`` per record. persist-queue is not
   multi-process safe; the run is bounded in records and seconds and counts duplicates and losses instead of
   failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import persistqueue
import zmq
import zmq.asyncio
from tqdm import tqdm

from persisting import Queue
from persisting.remote import Connection

from .records import make_records

PUT_BATCH = 100  # records per put_batch in the throughput runs, and the consumers' page size
WAIT_TIMEOUT_S = 30.0  # a consumer waiting this long for its next page gives up (reported as lost records)
START_TIMEOUT_S = 120.0  # every worker must have opened its queue by then
LATENCY_ROUNDS = 8
PQ_POLL_S = 0.001  # persist-queue consumers: sleep between empty polls (its blocking get polls every 10 s
# across processes: the put event it waits on is per process)

Tick = Callable[[int], None]


# -- results ------------------------------------------------------------------------------------------


def _pct(sorted_samples: list[float], q: float) -> float:
    return sorted_samples[max(0, math.ceil(q * len(sorted_samples)) - 1)]  # nearest rank


@dataclass(slots=True)
class LatencySeries:
    key: str
    label: str
    settings: str
    samples_us: list[float] = field(default_factory=list)

    def _sorted(self) -> list[float]:
        return sorted(self.samples_us)

    @property
    def p50_us(self) -> float:
        return _pct(self._sorted(), 0.50)

    @property
    def p99_us(self) -> float:
        return _pct(self._sorted(), 0.99)

    @property
    def max_us(self) -> float:
        return max(self.samples_us)

    @property
    def mean_us(self) -> float:
        return statistics.fmean(self.samples_us)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "settings": self.settings,
            "n": len(self.samples_us),
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "mean_us": self.mean_us,
            "max_us": self.max_us,
        }


@dataclass(slots=True)
class Throughput:
    key: str
    label: str
    settings: str
    target: int  # records the producers set out to write
    produced: int = 0  # puts acknowledged to the producers
    consumed: int = 0  # records handed to consumers, duplicates included
    unique: int = 0  # distinct records consumed
    duplicates: int = 0  # consumed - unique
    lost: int = 0  # acknowledged, never consumed and not left in the queue
    left: int = 0  # still in the queue after the run (persist-queue: ready or un-acked rows)
    produce_s: float = 0.0  # earliest worker start -> last producer done
    consume_s: float = 0.0  # earliest worker start -> last record consumed
    broker_cpu_s: float | None = None
    order_ok: bool | None = None  # every producer's records in the order it wrote them (persisting only)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def produce_rate(self) -> float:
        return self.produced / self.produce_s if self.produce_s > 0 else 0.0

    @property
    def consume_rate(self) -> float:
        return self.unique / self.consume_s if self.consume_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["produce_rec_per_s"] = self.produce_rate
        out["consume_rec_per_s"] = self.consume_rate
        return out


@dataclass(slots=True)
class BrokerBenchResult:
    latency: list[LatencySeries]
    throughput: list[Throughput]
    broker_stop_s: float = 0.0
    broker_exit: int | None = None
    broker_log: list[str] = field(default_factory=list)  # WARNING and worse lines of the broker's stderr
    wall_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def series(self, key: str) -> LatencySeries | None:
        return next((s for s in self.latency if s.key == key), None)


# -- processes we start -------------------------------------------------------------------------------


@contextlib.contextmanager
def broker_process(
    storage: Path, address: str, log_path: Path, extra: Sequence[str] = (), log_level: str = "INFO"
) -> Iterator[subprocess.Popen[bytes]]:
    """``persisting-broker`` on ``storage``/``address`` (plus ``extra`` flags), up once it printed its ready line;
    SIGTERM on exit. Its stderr is appended to ``log_path``."""
    cmd = [sys.executable, "-m", "broker", "--storage-path", str(storage), "--socket", address]
    cmd += ["--log-level", log_level, *extra]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
    try:
        _await_ready(proc, deadline=time.monotonic() + 60)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _await_ready(proc: subprocess.Popen[bytes], deadline: float) -> None:
    out = proc.stdout
    if out is None:
        raise RuntimeError("broker started without a stdout pipe")
    seen = b""
    while b"\n" not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise RuntimeError(f"persisting-broker did not get ready (exit {proc.poll()}); stdout so far: {seen!r}")
        ready, _, _ = select.select([out], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                continue
            seen += chunk
    if b"persisting-broker ready on" not in seen:
        raise RuntimeError(f"unexpected first line from persisting-broker: {seen!r}")


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, from /proc (None where that is not available)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def echo_server_main(address: str) -> None:
    """A ROUTER that sends every message straight back (frames untouched) until it gets the frame b"stop"."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    try:
        while True:
            frames = sock.recv_multipart(copy=True)
            if frames[1:] == [b"stop"]:
                sock.send_multipart(frames)
                return
            sock.send_multipart(frames)
    finally:
        sock.close(linger=0)
        ctx.term()


# -- 1. latency -----------------------------------------------------------------------------------------


async def _latency(
    broker: str, echo: str, n: int, warmup: int, seed: int, tick: Tick
) -> tuple[list[LatencySeries], dict[str, int]]:
    records = make_records(n + warmup, seed)
    packed = [msgpack.packb(r, use_bin_type=True) for r in records]

    sync_ctx = zmq.Context()
    raw = sync_ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(echo)
    async_ctx = zmq.asyncio.Context()
    araw = async_ctx.socket(zmq.DEALER)
    araw.setsockopt(zmq.LINGER, 0)
    araw.connect(echo)
    conn = Connection(broker)  # persisting's client transport, on this loop, without the engine-loop hop
    q_proc = Queue("latency-process", broker=broker, durability="process")
    q_sync = Queue("latency-sync", broker=broker, durability="sync")
    await q_proc.open()
    await q_sync.open()

    async def raw_sync(i: int) -> None:
        raw.send(packed[i])
        msgpack.unpackb(raw.recv(), raw=False)

    async def raw_async(i: int) -> None:
        await araw.send(packed[i])
        msgpack.unpackb(await araw.recv(), raw=False)

    async def hello(_i: int) -> None:
        await conn.request("hello", {})

    async def put_process(i: int) -> None:
        await q_proc.put(records[i])

    async def put_sync(i: int) -> None:
        await q_sync.put(records[i])

    plan: list[tuple[LatencySeries, Callable[[int], Awaitable[None]]]] = [
        (
            LatencySeries(
                "zmq-raw",
                "raw ZeroMQ ipc echo",
                "blocking pyzmq DEALER -> ROUTER echo process; msgpack of one record (the floor)",
            ),
            raw_sync,
        ),
        (
            LatencySeries("zmq-asyncio", "raw ZeroMQ ipc echo", "as above with a zmq.asyncio DEALER on asyncio"),
            raw_async,
        ),
        (
            LatencySeries(
                "broker-hello",
                "persisting protocol",
                "'hello' op via persisting.remote.Connection on the caller's loop: envelope codec, broker "
                "dispatch and reply, no topic, no storage",
            ),
            hello,
        ),
        (
            LatencySeries(
                "put-process", "persisting Queue.put", 'broker mode, durability="process" (write(2), no fsync)'
            ),
            put_process,
        ),
        (
            LatencySeries(
                "put-sync", "persisting Queue.put", 'broker mode, durability="sync" (default: fdatasync before the ack)'
            ),
            put_sync,
        ),
    ]
    try:
        for _series, fn in plan:
            for i in range(warmup):
                await fn(n + i)
            tick(warmup)
        per_round = math.ceil(n / LATENCY_ROUNDS)
        for start in range(0, n, per_round):
            stop = min(n, start + per_round)
            for series, fn in plan:
                samples = series.samples_us
                for i in range(start, stop):
                    t0 = time.perf_counter_ns()
                    await fn(i)
                    samples.append((time.perf_counter_ns() - t0) / 1e3)
                tick(stop - start)
        counts = {"latency-process": len(q_proc), "latency-sync": len(q_sync)}
    finally:
        await q_proc.aclose()
        await q_sync.aclose()
        raw.close(linger=0)
        araw.close(linger=0)
        sync_ctx.term()
        async_ctx.term()
    return [s for s, _ in plan], counts


# -- 2. persisting 2x2 through the broker ----------------------------------------------------------------


def _write_result(path: str, info: dict[str, Any], pairs: np.ndarray | None = None) -> None:
    if pairs is not None:
        np.save(path + ".npy", pairs)
    Path(path + ".json").write_text(json.dumps(info))


def persisting_producer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    try:
        asyncio.run(_persisting_producer(spec, info))
    except Exception as exc:
        info["error"] = repr(exc)
        with contextlib.suppress(Exception):
            spec["barrier"].abort()
    _write_result(spec["out"], info)


async def _persisting_producer(spec: dict[str, Any], info: dict[str, Any]) -> None:
    count, batch, counter = spec["count"], spec["batch"], spec["counter"]
    records = make_records(count, spec["seed"], start=spec["index"] * count)
    q = Queue(spec["topic"], broker=spec["broker"], durability=spec["durability"])
    await q.open()
    try:
        spec["barrier"].wait(START_TIMEOUT_S)
        info["t0"] = time.monotonic()
        for i in range(0, count, batch):
            chunk = records[i : i + batch]
            await q.put_batch(chunk)
            info["produced"] = i + len(chunk)
            with counter.get_lock():
                counter.value += len(chunk)
        info["t1"] = time.monotonic()
    finally:
        await q.aclose()


def persisting_consumer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    pairs: list[tuple[int, int]] = []
    try:
        asyncio.run(_persisting_consumer(spec, info, pairs))
    except Exception as exc:
        info["error"] = repr(exc)
        with contextlib.suppress(Exception):
            spec["barrier"].abort()
    _write_result(spec["out"], info, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))


async def _persisting_consumer(spec: dict[str, Any], info: dict[str, Any], pairs: list[tuple[int, int]]) -> None:
    total, page, counter = spec["total"], spec["page"], spec["counter"]
    q = Queue(spec["topic"], broker=spec["broker"], durability=spec["durability"], batch_size=page)
    await q.open()
    try:
        spec["barrier"].wait(START_TIMEOUT_S)
        info["t0"] = time.monotonic()
        for start in range(spec["index"] * page, total, spec["consumers"] * page):
            want = min(page, total - start)
            got = 0
            async for rows in q.stream(limit=want, offset=start, wait=True, timeout=WAIT_TIMEOUT_S):
                pairs.extend((start + got + j, int(r["id"])) for j, r in enumerate(rows))
                got += len(rows)
                with counter.get_lock():
                    counter.value += len(rows)
            if got < want:
                info["error"] = f"no record at index {start + got} within {WAIT_TIMEOUT_S:g} s; gave up"
                break
        info["t1"] = time.monotonic()
    finally:
        await q.aclose()


def _join_all(procs: list[Any], timeout: float) -> list[str]:
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


def _read_result(path: Path) -> tuple[dict[str, Any], np.ndarray | None]:
    try:
        info: dict[str, Any] = json.loads(Path(str(path) + ".json").read_text())
    except FileNotFoundError:
        return {"error": "wrote no result"}, None
    npy = Path(str(path) + ".npy")
    return info, (np.load(npy) if npy.exists() else None)


def _watch(procs: list[Any], counter: Any, tick: Tick, timeout: float, seen: int = 0) -> int:
    """Forward the workers' shared counter to the progress bar until they all exit (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
        now = counter.value
        tick(now - seen)
        seen = now
    tick(counter.value - seen)
    return int(counter.value)


def run_persisting_2x2(
    broker: str, broker_pid: int, durability: str, total: int, work: Path, seed: int, tick: Tick
) -> Throughput:
    ctx = multiprocessing.get_context("spawn")
    producers, consumers = 2, 2
    per_producer = total // producers
    topic = f"throughput-{durability}"
    barrier = ctx.Barrier(producers + consumers + 1)
    counter = ctx.Value("q", 0)
    common = {"broker": broker, "topic": topic, "durability": durability, "barrier": barrier, "counter": counter}
    procs = []
    for i in range(producers):
        spec = {**common, "index": i, "count": per_producer, "batch": PUT_BATCH, "seed": seed}
        spec["out"] = str(work / f"{topic}-producer-{i}")
        procs.append(ctx.Process(target=persisting_producer_main, args=(spec,), name=f"producer-{i}"))
    for i in range(consumers):
        spec = {**common, "index": i, "consumers": consumers, "total": total, "page": PUT_BATCH}
        spec["out"] = str(work / f"{topic}-consumer-{i}")
        procs.append(ctx.Process(target=persisting_consumer_main, args=(spec,), name=f"consumer-{i}"))
    row = Throughput(
        f"persisting-{durability}",
        "persisting via broker",
        f'durability="{durability}"; 2 producers put_batch({PUT_BATCH}) of their own records; 2 consumers '
        f"split the index space in pages of {PUT_BATCH} (consumer c: pages c, c+2, ...) with "
        "stream(wait=True); 4 spawned processes, one broker",
        total,
    )
    for p in procs:
        p.start()
    cpu0 = None
    try:
        barrier.wait(START_TIMEOUT_S)
        cpu0 = _cpu_seconds(broker_pid)
        _watch(procs, counter, tick, timeout=600)
    except Exception as exc:  # a worker failed before the start: its result says why
        row.errors.append(f"start failed: {exc!r}")
    cpu1 = _cpu_seconds(broker_pid)
    if cpu0 is not None and cpu1 is not None:
        row.broker_cpu_s = cpu1 - cpu0
    row.errors += _join_all(procs, timeout=60)

    t0s, prod_t1, cons_t1 = [], [], []
    all_pairs = []
    for p in procs:
        info, pairs = _read_result(work / f"{topic}-{p.name}")
        if "error" in info:
            row.errors.append(f"{p.name}: {info['error']}")
        if "t0" in info:
            t0s.append(info["t0"])
        if p.name.startswith("producer"):
            row.produced += int(info.get("produced", 0))
            if "t1" in info:
                prod_t1.append(info["t1"])
        else:
            if "t1" in info:
                cons_t1.append(info["t1"])
            if pairs is not None:
                all_pairs.append(pairs)
    if t0s and prod_t1:
        row.produce_s = max(prod_t1) - min(t0s)
    if t0s and cons_t1:
        row.consume_s = max(cons_t1) - min(t0s)
    pairs = np.concatenate(all_pairs) if all_pairs else np.empty((0, 2), dtype=np.int64)
    _check_pairs(row, pairs, per_producer, producers)
    return row


def _check_pairs(row: Throughput, pairs: np.ndarray, per_producer: int, producers: int) -> None:
    """Count, duplicates and losses from the (global index, record id) pairs read; per-producer order."""
    row.consumed = len(pairs)
    ids = pairs[:, 1]
    uniq = np.unique(ids)
    row.unique = len(uniq)
    row.duplicates = row.consumed - row.unique
    expected = np.arange(producers * per_producer)
    row.lost = int(row.produced - np.isin(uniq, expected).sum())
    strays = int((~np.isin(uniq, expected)).sum())
    if strays:
        row.errors.append(f"{strays} record ids that no producer wrote")
    indexes = np.sort(pairs[:, 0])
    if len(indexes) and not np.array_equal(indexes, np.arange(len(indexes))):
        row.errors.append("the indexes read are not exactly 0..n-1")
    by_index = pairs[np.argsort(pairs[:, 0], kind="stable")]
    order_ok = True
    for p in range(producers):
        mine = by_index[(by_index[:, 1] >= p * per_producer) & (by_index[:, 1] < (p + 1) * per_producer), 1]
        order_ok &= bool(np.all(np.diff(mine) > 0))
    row.order_ok = order_ok


# -- 3. persist-queue SQLiteAckQueue 2x2 -------------------------------------------------------------------


def pq_producer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {"errors": 0, "error_examples": []}
    ids: list[int] = []
    try:
        count, counter = spec["count"], spec["counter"]
        records = make_records(count, spec["seed"], start=spec["index"] * count)
        q = persistqueue.SQLiteAckQueue(spec["path"], multithreading=True)
        spec["barrier"].wait(START_TIMEOUT_S)
        info["t0"] = t0 = time.monotonic()
        end = t0 + spec["limit_s"]
        for n, rec in enumerate(records, 1):
            if time.monotonic() >= end:
                info["stopped_at_limit"] = True
                break
            try:
                q.put(rec)
                ids.append(rec["id"])
            except Exception as exc:  # e.g. sqlite3.OperationalError: database is locked
                _note_error(info, exc)
            if n % PUT_BATCH == 0:
                with counter.get_lock():
                    counter.value += PUT_BATCH
        info["t1"] = time.monotonic()
        del q
    except Exception as exc:
        info["error"] = repr(exc)
        with contextlib.suppress(Exception):
            spec["barrier"].abort()
    _write_result(spec["out"], info, np.asarray(ids, dtype=np.int64))


def _note_error(info: dict[str, Any], exc: Exception) -> None:
    info["errors"] += 1
    if len(info["error_examples"]) < 3:
        info["error_examples"].append(repr(exc))


def pq_consumer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {"errors": 0, "error_examples": [], "ack_misses": 0}
    ids: list[int] = []
    try:
        counter, done = spec["counter"], spec["producers_done"]
        q = persistqueue.SQLiteAckQueue(spec["path"], multithreading=True)
        spec["barrier"].wait(START_TIMEOUT_S)
        info["t0"] = t0 = time.monotonic()
        info["t1"] = t0
        end = t0 + spec["limit_s"]
        while time.monotonic() < end:
            finished = done.is_set()  # read before the get: an empty queue after this means no more records
            try:
                item = q.get(block=False)
            except persistqueue.Empty:
                if finished:
                    break
                time.sleep(PQ_POLL_S)
                continue
            except Exception as exc:
                _note_error(info, exc)
                continue
            ids.append(int(item["id"]))
            info["t1"] = time.monotonic()
            try:
                if q.ack(item) is None:
                    info["ack_misses"] += 1
            except Exception as exc:
                _note_error(info, exc)
            if len(ids) % PUT_BATCH == 0:
                with counter.get_lock():
                    counter.value += PUT_BATCH
        else:
            info["stopped_at_limit"] = True
        del q
    except Exception as exc:
        info["error"] = repr(exc)
        with contextlib.suppress(Exception):
            spec["barrier"].abort()
    _write_result(spec["out"], info, np.asarray(ids, dtype=np.int64))


def run_persistqueue_2x2(total: int, limit_s: float, work: Path, seed: int, tick: Tick) -> Throughput:
    ctx = multiprocessing.get_context("spawn")
    producers, consumers = 2, 2
    per_producer = total // producers
    path = work / "sqlite-ack"
    persistqueue.SQLiteAckQueue(str(path), multithreading=True)  # create the table before 4 processes race to
    barrier = ctx.Barrier(producers + consumers + 1)
    counter = ctx.Value("q", 0)
    producers_done = ctx.Event()
    common = {"path": str(path), "barrier": barrier, "counter": counter, "limit_s": limit_s}
    prods = [
        ctx.Process(
            target=pq_producer_main,
            args=({**common, "index": i, "count": per_producer, "seed": seed, "out": str(work / f"pq-producer-{i}")},),
            name=f"producer-{i}",
        )
        for i in range(producers)
    ]
    cons = [
        ctx.Process(
            target=pq_consumer_main,
            args=({**common, "producers_done": producers_done, "out": str(work / f"pq-consumer-{i}")},),
            name=f"consumer-{i}",
        )
        for i in range(consumers)
    ]
    row = Throughput(
        "sqlite-ack",
        "persistqueue.SQLiteAckQueue",
        "multithreading=True, auto_commit=True (its only mode), one instance per process on one shared path; "
        "2 producers put() one record at a time, 2 consumers get(block=False) + ack() each record; "
        f"bounded at {total:,} records and {limit_s:g} s per worker",
        total,
    )
    for p in [*prods, *cons]:
        p.start()
    seen = 0
    try:
        barrier.wait(START_TIMEOUT_S)
        seen = _watch(prods, counter, tick, timeout=limit_s + 60)
    except Exception as exc:
        row.errors.append(f"start failed: {exc!r}")
    row.errors += _join_all(prods, timeout=limit_s + 60)
    producers_done.set()
    _watch(cons, counter, tick, timeout=limit_s + 60, seen=seen)
    row.errors += _join_all(cons, timeout=limit_s + 60)

    t0s: list[float] = []
    prod_t1: list[float] = []
    cons_t1: list[float] = []
    put_ids: list[np.ndarray] = []
    got_ids: list[np.ndarray] = []
    limited = False
    errors = 0
    examples: list[str] = []
    ack_misses = 0
    for p in [*prods, *cons]:
        info, ids = _read_result(work / f"pq-{p.name}")
        if "error" in info:
            row.errors.append(f"{p.name}: {info['error']}")
        errors += int(info.get("errors", 0))
        examples += info.get("error_examples", [])
        ack_misses += int(info.get("ack_misses", 0))
        limited |= bool(info.get("stopped_at_limit"))
        if "t0" in info:
            t0s.append(info["t0"])
        is_producer = p.name.startswith("producer")
        if "t1" in info:
            (prod_t1 if is_producer else cons_t1).append(info["t1"])
        if ids is not None:
            (put_ids if is_producer else got_ids).append(ids)
    put = np.concatenate(put_ids) if put_ids else np.empty(0, dtype=np.int64)
    got = np.concatenate(got_ids) if got_ids else np.empty(0, dtype=np.int64)
    row.produced = len(put)
    row.consumed = len(got)
    uniq = np.unique(got)
    row.unique = len(uniq)
    row.duplicates = row.consumed - row.unique
    if t0s and prod_t1:
        row.produce_s = max(prod_t1) - min(t0s)
    if t0s and cons_t1:
        row.consume_s = max(cons_t1) - min(t0s)
    after = persistqueue.SQLiteAckQueue(str(path), multithreading=True, auto_resume=False)
    # status: 0 put, never got; 1 nack'ed or resumed; 2 got, not acked; 5 acked (its ready_count() misses 0)
    waiting, unack, acked = after.qsize(), after.unack_count(), after.acked_count()
    after.resume_unack_tasks()  # what a restarted consumer would see again
    left_ids: list[int] = []
    while True:
        try:
            left_ids.append(int(after.get(block=False)["id"]))
        except persistqueue.Empty:
            break
    row.left = len(left_ids)
    left = np.asarray(left_ids, dtype=np.int64)
    row.lost = len(np.setdiff1d(np.unique(put), np.union1d(uniq, left)))
    row.notes.append(
        f"after the run the table holds {acked:,} acked rows, {waiting:,} never handed out and {unack:,} handed out "
        f"but not acked; {ack_misses:,} ack() calls found no row; {errors:,} exceptions in put/get/ack"
        + (f" (e.g. {examples[0]})" if examples else "")
        + f"; {row.duplicates:,} records were handed to both consumers (get() selects a row, then marks it, "
        "without a lock that spans processes)"
    )
    if limited:
        row.notes.append(f"stopped by the {limit_s:g} s limit before all {total:,} records were through")
    return row


# -- driver ---------------------------------------------------------------------------------------------------


def run_broker_bench(
    base: Path,
    *,
    latency_n: int,
    warmup: int,
    records: int,
    durabilities: tuple[str, ...],
    pq_records: int,
    pq_limit_s: float,
    seed: int,
    progress: bool = True,
) -> BrokerBenchResult:
    t_start = time.perf_counter()
    if records % (2 * PUT_BATCH):
        raise ValueError(f"records must be a multiple of {2 * PUT_BATCH} (2 producers x put_batch of {PUT_BATCH})")
    sock_dir = base / "sock"
    sock_dir.mkdir(parents=True, exist_ok=True)
    broker_addr = f"ipc://{sock_dir / 'b.sock'}"
    echo_addr = f"ipc://{sock_dir / 'echo.sock'}"
    work = base / "work"
    work.mkdir()
    log_path = base / "broker.log"
    total = 5 * (latency_n + warmup) + 2 * records * len(durabilities) + 2 * pq_records
    result = BrokerBenchResult([], [])
    result.settings = {
        "latency_n": latency_n,
        "warmup": warmup,
        "records": records,
        "put_batch": PUT_BATCH,
        "durabilities": list(durabilities),
        "pq_records": pq_records,
        "pq_limit_s": pq_limit_s,
    }
    ctx = multiprocessing.get_context("spawn")
    echo = ctx.Process(target=echo_server_main, args=(echo_addr,), name="zmq-echo", daemon=True)
    with tqdm(total=total, unit="rec", unit_scale=True, file=sys.stderr, disable=not progress) as bar:
        bar.set_description("starting broker and echo server")
        echo.start()
        try:
            with broker_process(base / "storage", broker_addr, log_path) as broker:
                bar.set_description("latency (5 series interleaved)")
                result.latency, counts = asyncio.run(
                    _latency(broker_addr, echo_addr, latency_n, warmup, seed, bar.update)
                )
                for topic, n in counts.items():
                    if n != latency_n + warmup:
                        result.broker_log.append(f"topic {topic} holds {n} records, expected {latency_n + warmup}")
                for durability in durabilities:
                    bar.set_description(f"persisting 2x2 {durability}")
                    result.throughput.append(
                        run_persisting_2x2(broker_addr, broker.pid, durability, records, work, seed, bar.update)
                    )
                t_stop = time.perf_counter()
            result.broker_stop_s = time.perf_counter() - t_stop
            result.broker_exit = broker.returncode
        finally:
            _stop_echo(echo, echo_addr)
        if pq_records:
            bar.set_description("persist-queue SQLiteAckQueue 2x2")
            result.throughput.append(run_persistqueue_2x2(pq_records, pq_limit_s, work, seed, bar.update))
    result.broker_log += [
        line for line in log_path.read_text(errors="replace").splitlines() if not line.startswith(("INFO", "DEBUG"))
    ]
    result.wall_s = time.perf_counter() - t_start
    return result


def _stop_echo(echo: Any, address: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(address)
        sock.send(b"stop")
        with contextlib.suppress(zmq.Again):
            sock.recv()
    finally:
        sock.close(linger=0)
        ctx.term()
    echo.join(10)
    if echo.is_alive():
        echo.terminate()
        echo.join(5)
