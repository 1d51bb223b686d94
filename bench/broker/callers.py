"""The callers of the ``broker`` suite's latency series: every socket, connection and queue they use, opened once
and closed once, and one method per series that makes one call with record ``i``."""

from __future__ import annotations

import itertools
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from persisting import Queue, SyncQueue
from persisting.client import _loop
from persisting.client.connection import Connection, connection
from persisting.wire import protocol

from .echo import LoopEcho


def _dealer(ctx: Any, address: str) -> Any:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


class Callers:
    """What the series call through; ``open`` before the first call, ``aclose`` after the last."""

    def __init__(self, broker: str, echo: str, loop_echo: str, records: list[dict[str, Any]]) -> None:
        self.broker, self.records = broker, records
        self.packed = [msgpack.packb(r, use_bin_type=True) for r in records]
        self.sync_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.raw = _dealer(self.sync_ctx, echo)
        self.raw_on_loop = _dealer(self.sync_ctx, loop_echo)
        self.raw_to_broker = _dealer(self.sync_ctx, broker)  # persisting's envelope from a bare socket: no client code
        self.hello_ids = itertools.count(1)
        self.async_ctx = zmq.asyncio.Context()
        self.araw = _dealer(self.async_ctx, echo)
        self.looped = LoopEcho(self.sync_ctx, echo)
        self.conn = Connection(broker)  # persisting's client transport, on this loop, without the engine-loop hop
        self.q_proc = Queue("latency-process", broker=broker, durability="process")
        self.q_sync = Queue("latency-sync", broker=broker, durability="sync")
        # Blocking callers (SyncQueue's path): each call runs in this thread, outside the bench's own loop's turn.
        self.b_proc = SyncQueue("latency-blocking-process", broker=broker, durability="process")
        self.b_sync = SyncQueue("latency-blocking-sync", broker=broker, durability="sync")

    async def open(self) -> None:
        await self.q_proc.open()
        await self.q_sync.open()

    def counts(self) -> dict[str, int]:
        """The records each put topic holds."""
        return {
            "latency-process": len(self.q_proc),
            "latency-sync": len(self.q_sync),
            "latency-blocking-process": len(self.b_proc),
            "latency-blocking-sync": len(self.b_sync),
        }

    async def aclose(self) -> None:
        await self.q_proc.aclose()
        await self.q_sync.aclose()
        self.b_proc.close()
        self.b_sync.close()
        for sock in (self.raw, self.raw_on_loop, self.raw_to_broker, self.araw):
            sock.close(linger=0)
        self.looped.close()
        self.sync_ctx.term()
        self.async_ctx.term()

    async def raw_sync(self, i: int) -> None:
        self.raw.send(self.packed[i])
        msgpack.unpackb(self.raw.recv(), raw=False)

    async def raw_server_loop(self, i: int) -> None:
        self.raw_on_loop.send(self.packed[i])
        msgpack.unpackb(self.raw_on_loop.recv(), raw=False)

    async def raw_hello(self, _i: int) -> None:
        self.raw_to_broker.send(protocol.encode_request(protocol.Request(next(self.hello_ids), "hello", {}))[0])
        protocol.decode_reply([self.raw_to_broker.recv()])

    async def raw_async(self, i: int) -> None:
        await self.araw.send(self.packed[i])
        msgpack.unpackb(await self.araw.recv(), raw=False)

    async def raw_loop(self, i: int) -> None:
        msgpack.unpackb((await self.looped.roundtrip(self.packed[i]))[0], raw=False)

    async def hello(self, _i: int) -> None:
        await self.conn.request("hello", {})

    async def put_process(self, i: int) -> None:
        await self.q_proc.put(self.records[i])

    async def put_sync(self, i: int) -> None:
        await self.q_sync.put(self.records[i])

    async def hello_blocking(self, _i: int) -> None:
        _loop.run(self._hello_request())

    async def _hello_request(self) -> None:
        await connection(self.broker).request("hello", {})

    async def put_process_blocking(self, i: int) -> None:
        self.b_proc.put(self.records[i])

    async def put_sync_blocking(self, i: int) -> None:
        self.b_sync.put(self.records[i])
