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

import asyncio
import contextlib
import itertools
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from bench.common.measure import Tick, nearest_rank
from bench.common.records import make_records
from persisting import Queue, SyncQueue
from persisting.client import _loop
from persisting.client.connection import Connection, connection
from persisting.wire import protocol, zsocket

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


class LoopEcho:
    """The raw echo read as persisting's client reads replies (client/connection.py): a plain DEALER, NOBLOCK send
    and receive, a loop reader callback that resolves the awaiting future; no envelope, no broker."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fut: asyncio.Future[list[bytes]] | None = None

    async def roundtrip(self, frame: bytes) -> list[bytes]:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self.sock.fileno(), self._drain)
        fut = self._fut = loop.create_future()
        zsocket.send(self.sock, [frame])
        if zsocket.readable(self.sock):  # the send may have taken the edge of a waiting reply
            loop.call_soon(self._drain)
        return await fut

    def _drain(self) -> None:
        while zsocket.readable(self.sock):
            frames = zsocket.recv(self.sock)
            if self._fut is not None and not self._fut.done():
                self._fut.set_result(frames)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close(linger=0)


def echo_server_main(address: str, on_loop: bool = False) -> None:
    """A ROUTER that sends every message straight back (frames untouched) until it gets the frame b"stop".

    ``on_loop``: served the way the broker serves (broker/server.py): on uvloop where installed, a loop reader on the
    socket's FD draining with NOBLOCK, the edge re-armed by asking for EVENTS; no request handling at all. What a
    request costs above this echo is the broker's own work; what this echo costs above the blocking one is the
    event loop's wake-up, which a server of many clients and its own I/O completions pays."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    if on_loop:
        try:
            _serve_on_loop(sock)
        finally:
            sock.close(linger=0)
            ctx.term()
        return
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


def _serve_on_loop(sock: zmq.Socket[bytes]) -> None:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()

    def drain() -> None:
        while zsocket.readable(sock):
            frames = sock.recv_multipart(zmq.NOBLOCK)
            sock.send_multipart(frames, zmq.NOBLOCK)
            if frames[1:] == [b"stop"]:
                loop.stop()
                return

    loop.add_reader(sock.fileno(), drain)
    loop.call_soon(drain)  # messages that came before the reader raise no new edge
    try:
        loop.run_forever()
    finally:
        loop.remove_reader(sock.fileno())
        loop.close()


def stop_echo(echo: Any, address: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(address)
        sock.send(b"stop")
        with contextlib.suppress(zmq.Again):  # no reply: it is stopped below all the same
            sock.recv()
    finally:
        sock.close(linger=0)
        ctx.term()
    echo.join(10)
    if echo.is_alive():
        echo.terminate()
        echo.join(5)


async def latency(
    broker: str, echo: str, loop_echo: str, n: int, warmup: int, seed: int, tick: Tick
) -> tuple[list[LatencySeries], dict[str, int]]:
    """The eleven series, and the records each put topic holds after them (the driver checks none went missing)."""
    records = make_records(n + warmup, seed)
    packed = [msgpack.packb(r, use_bin_type=True) for r in records]

    sync_ctx = zmq.Context()
    raw = sync_ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(echo)
    raw_on_loop = sync_ctx.socket(zmq.DEALER)
    raw_on_loop.setsockopt(zmq.LINGER, 0)
    raw_on_loop.connect(loop_echo)
    raw_to_broker = sync_ctx.socket(zmq.DEALER)  # persisting's envelope from a bare socket: no client code
    raw_to_broker.setsockopt(zmq.LINGER, 0)
    raw_to_broker.connect(broker)
    hello_ids = itertools.count(1)
    async_ctx = zmq.asyncio.Context()
    araw = async_ctx.socket(zmq.DEALER)
    araw.setsockopt(zmq.LINGER, 0)
    araw.connect(echo)
    looped = LoopEcho(sync_ctx, echo)
    conn = Connection(broker)  # persisting's client transport, on this loop, without the engine-loop hop
    q_proc = Queue("latency-process", broker=broker, durability="process")
    q_sync = Queue("latency-sync", broker=broker, durability="sync")
    await q_proc.open()
    await q_sync.open()
    # Blocking callers (SyncQueue's path): each call runs in this thread, outside the bench's own loop's turn.
    b_proc = SyncQueue("latency-blocking-process", broker=broker, durability="process")
    b_sync = SyncQueue("latency-blocking-sync", broker=broker, durability="sync")

    async def raw_sync(i: int) -> None:
        raw.send(packed[i])
        msgpack.unpackb(raw.recv(), raw=False)

    async def raw_server_loop(i: int) -> None:
        raw_on_loop.send(packed[i])
        msgpack.unpackb(raw_on_loop.recv(), raw=False)

    async def raw_hello(_i: int) -> None:
        raw_to_broker.send(protocol.encode_request(protocol.Request(next(hello_ids), "hello", {}))[0])
        protocol.decode_reply([raw_to_broker.recv()])

    async def raw_async(i: int) -> None:
        await araw.send(packed[i])
        msgpack.unpackb(await araw.recv(), raw=False)

    async def raw_loop(i: int) -> None:
        msgpack.unpackb((await looped.roundtrip(packed[i]))[0], raw=False)

    async def hello(_i: int) -> None:
        await conn.request("hello", {})

    async def put_process(i: int) -> None:
        await q_proc.put(records[i])

    async def put_sync(i: int) -> None:
        await q_sync.put(records[i])

    async def hello_request() -> None:
        await connection(broker).request("hello", {})

    async def hello_blocking(_i: int) -> None:
        _loop.run(hello_request())

    async def put_process_blocking(i: int) -> None:
        b_proc.put(records[i])

    async def put_sync_blocking(i: int) -> None:
        b_sync.put(records[i])

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
            LatencySeries(
                "zmq-raw-loop-server",
                "raw ZeroMQ ipc echo, server on a loop",
                "blocking pyzmq DEALER -> ROUTER echo served like the broker (uvloop reader, NOBLOCK drain): the "
                "floor of an event-loop server",
            ),
            raw_server_loop,
        ),
        (
            LatencySeries("zmq-asyncio", "raw ZeroMQ ipc echo", "as above with a zmq.asyncio DEALER on asyncio"),
            raw_async,
        ),
        (
            LatencySeries(
                "zmq-loop",
                "raw ZeroMQ ipc echo",
                "as above read like persisting's client: plain DEALER, loop reader callback, a future (asyncio floor)",
            ),
            raw_loop,
        ),
        (
            LatencySeries(
                "broker-hello",
                "persisting protocol",
                "'hello' op via persisting.client.connection.Connection on the caller's loop: envelope codec, broker "
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
        (
            LatencySeries(
                "raw-hello",
                "persisting protocol, bare socket",
                "'hello' envelope sent and its reply decoded on a blocking pyzmq DEALER, no persisting client code: "
                "the broker's part alone",
            ),
            raw_hello,
        ),
        (
            LatencySeries(
                "blocking-hello",
                "persisting protocol, blocking caller",
                "'hello' from a blocking call (SyncQueue's path): the caller thread's own DEALER, recv blocking, "
                "no thread hand-off",
            ),
            hello_blocking,
        ),
        (
            LatencySeries(
                "blocking-put-process", "persisting SyncQueue.put", 'broker mode, durability="process", blocking'
            ),
            put_process_blocking,
        ),
        (
            LatencySeries("blocking-put-sync", "persisting SyncQueue.put", 'broker mode, durability="sync", blocking'),
            put_sync_blocking,
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
        counts = {
            "latency-process": len(q_proc),
            "latency-sync": len(q_sync),
            "latency-blocking-process": len(b_proc),
            "latency-blocking-sync": len(b_sync),
        }
    finally:
        await q_proc.aclose()
        await q_sync.aclose()
        b_proc.close()
        b_sync.close()
        raw.close(linger=0)
        raw_on_loop.close(linger=0)
        raw_to_broker.close(linger=0)
        araw.close(linger=0)
        looped.close()
        sync_ctx.term()
        async_ctx.term()
    return [s for s, _ in plan], counts
