"""The ``broker`` benchmark's latency series: one ~100-byte record per request, sequential, eleven series
interleaved in rounds so that they share the machine's noise: raw DEALER->ROUTER echo (blocking pyzmq client, the
floor), the same echo served on an event loop the way the broker serves (the floor of an event-loop server), the
same with a ``zmq.asyncio`` client, the same read the way persisting's client reads its replies (an
asyncio reader callback resolving a future: the floor of any client on asyncio), persisting's protocol ``hello``
(client Connection + broker, no storage), and ``Queue.put`` with ``durability="process"`` and ``"sync"``; then
``hello`` and both puts again from a blocking caller (``SyncQueue``'s path: the caller thread's own socket,
``client/blocking.py``), the like-for-like of the blocking echo. The echo servers are spawned processes this module
starts and stops."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common.measure import Tick, nearest_rank
from bench.common.records import make_records

from .callers import Callers

LATENCY_ROUNDS = 8


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
        return nearest_rank(self._sorted(), 0.50)

    @property
    def p99_us(self) -> float:
        return nearest_rank(self._sorted(), 0.99)

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


# The series in the order they run in each round: (key, label, settings, the ``Callers`` method that makes one call).
SERIES: tuple[tuple[str, str, str, str], ...] = (
    (
        "zmq-raw",
        "raw ZeroMQ ipc echo",
        "blocking pyzmq DEALER -> ROUTER echo process; msgpack of one record (the floor)",
        "raw_sync",
    ),
    (
        "zmq-raw-loop-server",
        "raw ZeroMQ ipc echo, server on a loop",
        "blocking pyzmq DEALER -> ROUTER echo served like the broker (uvloop reader, NOBLOCK drain): the "
        "floor of an event-loop server",
        "raw_server_loop",
    ),
    ("zmq-asyncio", "raw ZeroMQ ipc echo", "as above with a zmq.asyncio DEALER on asyncio", "raw_async"),
    (
        "zmq-loop",
        "raw ZeroMQ ipc echo",
        "as above read like persisting's client: plain DEALER, loop reader callback, a future (asyncio floor)",
        "raw_loop",
    ),
    (
        "broker-hello",
        "persisting protocol",
        "'hello' op via persisting.client.connection.Connection on the caller's loop: envelope codec, broker "
        "dispatch and reply, no topic, no storage",
        "hello",
    ),
    ("put-process", "persisting Queue.put", 'broker mode, durability="process" (write(2), no fsync)', "put_process"),
    (
        "put-sync",
        "persisting Queue.put",
        'broker mode, durability="sync" (default: fdatasync before the ack)',
        "put_sync",
    ),
    (
        "raw-hello",
        "persisting protocol, bare socket",
        "'hello' envelope sent and its reply decoded on a blocking pyzmq DEALER, no persisting client code: "
        "the broker's part alone",
        "raw_hello",
    ),
    (
        "blocking-hello",
        "persisting protocol, blocking caller",
        "'hello' from a blocking call (SyncQueue's path): the caller thread's own DEALER, recv blocking, "
        "no thread hand-off",
        "hello_blocking",
    ),
    (
        "blocking-put-process",
        "persisting SyncQueue.put",
        'broker mode, durability="process", blocking',
        "put_process_blocking",
    ),
    ("blocking-put-sync", "persisting SyncQueue.put", 'broker mode, durability="sync", blocking', "put_sync_blocking"),
)

Call = Callable[[int], Awaitable[None]]


async def latency(
    broker: str, echo: str, loop_echo: str, n: int, warmup: int, seed: int, tick: Tick
) -> tuple[list[LatencySeries], dict[str, int]]:
    """The eleven series, and the records each put topic holds after them (the driver checks none went missing)."""
    callers = Callers(broker, echo, loop_echo, make_records(n + warmup, seed))
    await callers.open()
    try:
        plan: list[tuple[LatencySeries, Call]] = [
            (LatencySeries(key, label, settings), getattr(callers, method)) for key, label, settings, method in SERIES
        ]
        await _interleaved(plan, n, warmup, tick)
        counts = callers.counts()
    finally:
        await callers.aclose()
    return [s for s, _ in plan], counts


async def _interleaved(plan: list[tuple[LatencySeries, Call]], n: int, warmup: int, tick: Tick) -> None:
    """Each series' warm-up calls (on the records after the timed ones), then ``n`` timed calls per series in
    ``LATENCY_ROUNDS`` rounds, every series in turn within a round: the machine's noise falls on each alike."""
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
