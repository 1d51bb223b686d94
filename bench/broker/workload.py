"""The ``broker`` benchmark: persisting through ``persisting-broker`` against the raw ZeroMQ round trip it rides
on, and a 2-producer / 2-consumer workload through the broker against persist-queue's ``SQLiteAckQueue`` shared
by the same four processes. This module runs the parts in order and holds their result.

Everything runs in one invocation: the benchmark starts its own broker (a subprocess on a temp storage folder and
an ipc socket under /tmp) and its own ZeroMQ echo server (a spawned process), and stops both at the end. Worker
processes are started with the ``spawn`` method (Lance is not fork-safe) and all wait on one barrier after
opening their queue, so start-up is never timed. ``time.monotonic`` is one clock for every process on Linux, so
the aggregate windows span from the earliest worker start to the latest worker end.

1. Latency (``broker_latency``): raw ZeroMQ echo (blocking, zmq.asyncio, a loop reader), protocol ``hello``,
   ``Queue.put`` with ``durability="process"`` and ``"sync"``, interleaved.
2. Throughput (``broker_throughput``): 2 producers, 2 consumers through the broker, per durability; then the same
   with ``PIPELINED_INFLIGHT`` requests in flight per process (pipelined on its one connection).
3. The same 2x2 shape through persist-queue's ``SQLiteAckQueue`` (``persistqueue_peer.py``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.broker.echo import echo_server_main, stop_echo
from bench.broker.latency import LatencySeries, latency
from bench.broker.persistqueue_peer import run_persistqueue_2x2
from bench.broker.throughput import PIPELINED_INFLIGHT, PUT_BATCH, Throughput, run_persisting_2x2
from bench.common.broker_process import broker_process

__all__ = ["BrokerBenchResult", "broker_process", "run_broker_bench"]


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
    loop_echo_addr = f"ipc://{sock_dir / 'loop-echo.sock'}"
    work = base / "work"
    work.mkdir()
    log_path = base / "broker.log"
    total = 11 * (latency_n + warmup) + 4 * records * len(durabilities) + 2 * pq_records
    result = BrokerBenchResult([], [])
    result.settings = {"latency_n": latency_n, "warmup": warmup, "records": records, "put_batch": PUT_BATCH,
                       "durabilities": list(durabilities), "pq_records": pq_records,
                       "pq_limit_s": pq_limit_s}  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    echo = ctx.Process(target=echo_server_main, args=(echo_addr,), name="zmq-echo", daemon=True)
    loop_echo = ctx.Process(target=echo_server_main, args=(loop_echo_addr, True), name="zmq-loop-echo", daemon=True)
    with tqdm(total=total, unit="rec", unit_scale=True, file=sys.stderr, disable=not progress) as bar:
        bar.set_description("starting broker and echo server")
        echo.start()
        loop_echo.start()
        try:
            _through_the_broker(
                base,
                (broker_addr, echo_addr, loop_echo_addr),
                latency_n,
                warmup,
                records,
                durabilities,
                seed,
                result,
                bar,
            )
        finally:
            stop_echo(echo, echo_addr)
            stop_echo(loop_echo, loop_echo_addr)
        if pq_records:
            bar.set_description("persist-queue SQLiteAckQueue 2x2")
            result.throughput.append(run_persistqueue_2x2(pq_records, pq_limit_s, work, seed, bar.update))
    result.broker_log += [
        line for line in log_path.read_text(errors="replace").splitlines() if not line.startswith(("INFO", "DEBUG"))
    ]
    result.wall_s = time.perf_counter() - t_start
    return result


def _through_the_broker(
    base: Path, addresses: tuple[str, str, str], latency_n: int, warmup: int, records: int,
    durabilities: tuple[str, ...], seed: int, result: BrokerBenchResult, bar: Any,
) -> None:  # fmt: skip
    """One broker: the latency series, then the 2x2 runs per durability, serial and pipelined; then its stop."""
    broker_addr, echo_addr, loop_echo_addr = addresses
    work, log_path = base / "work", base / "broker.log"
    with broker_process(base / "storage", broker_addr, log_path) as broker:
        bar.set_description("latency (11 series interleaved)")
        result.latency, counts = asyncio.run(
            latency(broker_addr, echo_addr, loop_echo_addr, latency_n, warmup, seed, bar.update)
        )
        for topic, n in counts.items():
            if n != latency_n + warmup:
                result.broker_log.append(f"topic {topic} holds {n} records, expected {latency_n + warmup}")
        for inflight in (1, PIPELINED_INFLIGHT):
            for durability in durabilities:
                bar.set_description(f"persisting 2x2 {durability}, {inflight} in flight")
                result.throughput.append(
                    run_persisting_2x2(broker_addr, broker.pid, durability, records, work, seed, bar.update, inflight)
                )
        t_stop = time.perf_counter()
    result.broker_stop_s = time.perf_counter() - t_stop
    result.broker_exit = broker.returncode
