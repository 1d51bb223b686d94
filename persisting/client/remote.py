"""Broker mode on the client side: a RemoteTopic with the engine's interface, over one DEALER per process.

``Queue`` drives a RemoteTopic exactly as it drives an embedded ``Topic`` (append, read, wait_beyond, flush,
stats), so the API adds nothing in broker mode. A RemoteTopic runs on its caller's event loop (one DEALER per
loop and broker); tensor batches go through the arena (``remote_tensors.py``, a mixin of RemoteTopic).

Retries: a request that gets no reply is re-sent with the same request id every ``RESEND_SECONDS`` until its
timeout. A ``put_batch`` carries an idempotency key, so a re-sent (or late-delivered) put is stored once even
across a broker restart. After the timeout the call raises ``BrokerUnavailableError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from .. import errors
from ..engine.config import TopicConfig
from ..tensors.arena import peer_id
from ..wire import protocol
from ..wire.codec import EncodedBatch
from ..wire.protocol import WAIT_SLICE_SECONDS, Reply, Request
from .remote_tensors import TensorClient

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = float(os.environ.get("PERSISTING_REQUEST_TIMEOUT", "30"))
RESEND_SECONDS = 2.0
RELEASE_DELAY_SECONDS = 0.02  # garbage-collected arena views are reported within this, or with the next request

# One DEALER per (event loop, broker address): a RemoteTopic is driven from its caller's loop, with no hop to
# the background loop (a thread hop costs about as much as the ZeroMQ round trip itself).
_connections: dict[tuple[int, str], tuple[asyncio.AbstractEventLoop, Connection]] = {}


def _forget_connections() -> None:
    _connections.clear()  # sockets do not survive fork; a child connects anew


os.register_at_fork(after_in_child=_forget_connections)


def connection(address: str) -> Connection:
    loop = asyncio.get_running_loop()
    entry = _connections.get((id(loop), address))
    if entry is None or entry[0] is not loop:
        for key, (other, conn) in list(_connections.items()):
            if other.is_closed():  # asyncio.run() finished: its sockets can go
                conn.close()
                del _connections[key]
        entry = _connections[(id(loop), address)] = (loop, Connection(address))
    return entry[1]


class Connection:
    """One DEALER socket to one broker, shared by every RemoteTopic of this process on one event loop.

    A plain ZeroMQ socket, read with NOBLOCK from a loop reader callback: zmq.asyncio costs a future per send
    and per recv, which on a busy machine was as much CPU as the rest of a request.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        # pyzmq makes a fresh instance in a forked child.
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        # Connection events: a broker that restarted never saw the requests the old one held (long-polls, a
        # lease waiting for space), and their first re-send may be far off; they go again once it is back.
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._lost = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._frames: dict[int, list[bytes]] = {}  # request id -> its frames, while it waits for its reply
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_pending = False
        self.max_message_bytes = protocol.DEFAULT_MAX_MESSAGE_BYTES
        # Arena holds whose views were garbage-collected, to tell the broker: they ride on the next tensor request,
        # or go on their own after RELEASE_DELAY_SECONDS (finalizers run in any thread, hence the lock).
        self._released: list[int] = []
        self._release_lock = threading.Lock()
        self._release_armed = False

    def defer_release(self, hold: int, loop: asyncio.AbstractEventLoop) -> None:
        with self._release_lock:
            self._released.append(hold)
            arm = not self._release_armed
            self._release_armed = True
        if arm:
            with contextlib.suppress(RuntimeError):  # loop closed: the broker reaps the holds when we exit
                loop.call_soon_threadsafe(loop.call_later, RELEASE_DELAY_SECONDS, self._send_releases)

    def take_releases(self) -> list[int]:
        with self._release_lock:
            released, self._released = self._released, []
            self._release_armed = False
        return released

    def _send_releases(self) -> None:
        released = self.take_releases()
        if released:
            task = asyncio.ensure_future(self.request("release", {"release": released, "peer": peer_id()}))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def close(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._sock.fileno())
            loop.remove_reader(self._monitor.fileno())
        self._loop = None
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._sock.fileno(), self._drain)
            loop.add_reader(self._monitor.fileno(), self._on_connection_event)
            loop.call_soon(self._on_connection_event)  # events queued before the reader was there

    def _on_connection_event(self) -> None:
        while True:  # edge-triggered like the socket's own FD: read every queued event
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            except (zmq.Again, zmq.ZMQError):
                return
            if event == zmq.EVENT_DISCONNECTED:
                self._lost = True
            elif event == zmq.EVENT_CONNECTED and self._lost:
                self._lost = False
                log.info("reconnected to %s; sending %d waiting request(s) again", self.address, len(self._frames))
                for request_id, frames in list(self._frames.items()):
                    fut = self._pending.get(request_id)
                    if fut is not None and not fut.done():
                        self._send(frames)

    def _kick(self) -> None:
        # ZeroMQ's FD is edge-triggered: a send may consume the edge of a reply that is already waiting.
        if not self._drain_pending and self._loop is not None:
            self._drain_pending = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_pending = False
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # the socket was closed under us
                log.debug("receiving from %s stopped: %s", self.address, exc)
                return
            try:
                reply = protocol.decode_reply(frames)
            except errors.ProtocolError as exc:
                log.warning("ignoring a malformed reply from %s: %s", self.address, exc)
                continue
            fut = self._pending.get(reply.id)
            if fut is not None and not fut.done():
                fut.set_result(reply)

    def _send(self, frames: list[bytes]) -> None:
        # zmq.Again: the queue to the broker is full (it is down or stalled); the resend timer tries again.
        with contextlib.suppress(zmq.Again):
            self._sock.send_multipart(frames, zmq.NOBLOCK)
        if int(self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._kick()

    async def request(
        self,
        op: str,
        args: dict[str, Any],
        buffers: list[bytes] | None = None,
        timeout: float | None = None,
        hold: float = 0.0,
    ) -> Reply:
        """Send one request and await its reply. ``hold``: seconds the broker may keep it (a long-poll) before
        answering; the first re-send waits that much longer, so a waiting long-poll is not sent twice."""
        req = Request(next(self._ids), op, args, buffers or [])
        frames = protocol.encode_request(req)
        size = sum(len(f) for f in frames)
        if size > self.max_message_bytes:
            raise errors.InvalidRecordError(
                f"this {op} request is {size} bytes, over the broker's limit of {self.max_message_bytes}; "
                "split the batch (or raise the broker's max message size)"
            )
        loop = asyncio.get_running_loop()
        self._watch(loop)
        fut: asyncio.Future[Reply] = loop.create_future()
        self._pending[req.id] = fut
        self._frames[req.id] = frames
        limit = timeout or hold + REQUEST_TIMEOUT_SECONDS  # a held request may answer only after its hold
        deadline = loop.time() + limit
        timer: asyncio.TimerHandle | None = None

        def resend() -> None:
            # A timer, not wait_for: the common case (a reply within RESEND_SECONDS) then costs one await.
            nonlocal timer
            if fut.done():
                return
            left = deadline - loop.time()
            if left <= 0:
                fut.set_exception(
                    errors.BrokerUnavailableError(
                        f"no reply from the broker at {self.address} to {op!r} within {limit:.0f} s; "
                        "is persisting-broker running there?"
                    )
                )
                return
            self._send(frames)  # queued by ZeroMQ; delivered once the broker is back
            timer = loop.call_later(min(RESEND_SECONDS, left), resend)

        self._send(frames)
        timer = loop.call_later(min(hold + RESEND_SECONDS, limit), resend)
        try:
            return _raise_for(await fut)
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(req.id, None)
            self._frames.pop(req.id, None)

    async def long_poll(
        self,
        op: str,
        make_args: Callable[[float], dict[str, Any]],
        timeout: float | None,
        done: Callable[[Reply], bool],
    ) -> Reply:
        """Ask ``op`` with a ``wait`` of at most WAIT_SLICE_SECONDS at a time until ``done(reply)`` or
        ``timeout`` (None: for ever) passes; returns the last reply."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = WAIT_SLICE_SECONDS if deadline is None else min(max(0.0, deadline - loop.time()), WAIT_SLICE_SECONDS)
            reply = await self.request(op, make_args(left), timeout=left + REQUEST_TIMEOUT_SECONDS, hold=left)
            if done(reply) or (deadline is not None and loop.time() >= deadline):
                return reply


_ERROR_TYPES: dict[str, type[errors.PersistingError]] = {
    name: getattr(errors, name) for name in errors.__all__ if name not in ("SchemaConflictError", "RemoteError")
}


def _raise_for(reply: Reply) -> Reply:
    if reply.ok:
        return reply
    cls = _ERROR_TYPES.get(reply.error_type)
    if cls is not None:
        raise cls(reply.error_message)
    if reply.error_type == "SchemaConflictError":
        d = reply.error_details
        if {"field", "stored", "given"} <= d.keys():
            raise errors.SchemaConflictError(d["field"], d["stored"], d["given"])
        raise errors.InvalidRecordError(reply.error_message)
    raise errors.RemoteError(reply.error_type, reply.error_message)


class RemoteTopic(TensorClient):
    """A topic served by a broker, with the methods of ``engine.Topic`` that ``Queue`` uses."""

    def __init__(self, name: str, address: str, config: TopicConfig) -> None:
        self.name = name
        self.address = address
        self.config = config
        self.kinds: dict[str, str] = {}
        self._count = 0
        self._arena_info: dict[str, Any] | None = None
        self._spare: list[Any] | None = None  # [extent, offset, bytes, generation] leased ahead for the next put
        self._wire_config = {
            "num_buckets": config.num_buckets,
            "bucket_column": config.bucket_column,
            "batch_size": config.batch_size,
            "auto_flush_interval_sec": config.auto_flush_interval_sec,
            "durability": config.durability,
        }

    @property
    def _conn(self) -> Connection:
        return connection(self.address)

    def _args(self, **extra: Any) -> dict[str, Any]:
        return {"topic": self.name, "config": self._wire_config, **extra}

    async def open(self) -> None:
        hello = await self._conn.request("hello", {"peer": peer_id()})  # listed by the status command
        self._arena_info = dict(hello.result.get("arena") or {})
        self._conn.max_message_bytes = int(hello.result.get("max_message_bytes", protocol.DEFAULT_MAX_MESSAGE_BYTES))
        stats = (await self._conn.request("stats", self._args())).result
        self.kinds = dict(stats.get("fields", {}))
        self._count = int(stats.get("total_count", 0))

    async def append(
        self, batch: EncodedBatch, partition: str, rows_blob: bytes, key: str | None = None, of: list[int] | None = None
    ) -> tuple[int, int]:
        args = self._args(partition=partition, kinds=batch.kinds, count=len(batch.rows), key=key or uuid.uuid4().hex)
        if of is not None:
            args["of"] = of
        reply = await self._conn.request("put_batch", args, [rows_blob])
        first, n = reply.result
        self.kinds.update(batch.kinds)
        self._count = max(self._count, first + n)
        return int(first), int(n)

    async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        rows, kinds, _end = await self.read_window(offset, limit)
        return rows, kinds

    async def read_window(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        rows, _waited, end = await self._read(self._args(offset=offset, limit=limit))
        return rows, self.kinds, end

    async def read_waiting(
        self, offset: int, limit: int, timeout: float | None
    ) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """Like read_window, but at the end of the data wait up to ``timeout`` seconds (None: for ever) for rows
        at ``offset``: a long-poll in the broker, so a consumer that keeps up pays one round trip per page."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = WAIT_SLICE_SECONDS if deadline is None else min(max(0.0, deadline - loop.time()), WAIT_SLICE_SECONDS)
            args = self._args(offset=offset, limit=limit, wait=left)
            rows, waited, end = await self._read(args, timeout=left + REQUEST_TIMEOUT_SECONDS, hold=left)
            if rows or end > offset or (deadline is not None and loop.time() >= deadline):
                return rows, self.kinds, end
            # A broker from before read took "wait" answered at once: wait the old way.
            if not waited and not await self.wait_beyond(
                offset, None if deadline is None else max(0.0, deadline - loop.time())
            ):
                return [], self.kinds, offset

    async def _read(
        self, args: dict[str, Any], timeout: float | None = None, hold: float = 0.0
    ) -> tuple[list[dict[str, Any]], bool, int]:
        reply = await self._conn.request("read", args, timeout=timeout, hold=hold)
        if len(reply.buffers) != 1:
            raise errors.ProtocolError("read reply without its rows buffer")
        rows = msgpack.unpackb(reply.buffers[0], raw=False, use_list=True)
        self.kinds = dict(reply.result["kinds"])
        self._count = int(reply.result["count"])
        end = reply.result.get("end")
        if type(end) is not int:
            raise errors.ProtocolError("read reply without the end of its window")
        return rows, bool(reply.result.get("waited")), end

    async def wait_beyond(self, index: int, timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            hold = WAIT_SLICE_SECONDS if left is None else min(left, WAIT_SLICE_SECONDS)
            reply = await self._conn.request(
                "wait", self._args(index=index, timeout=left), timeout=hold + REQUEST_TIMEOUT_SECONDS, hold=hold
            )
            if reply.result or (deadline is not None and loop.time() >= deadline):
                return bool(reply.result)

    async def flush(self) -> None:
        await self._conn.request("flush", self._args())

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = (await self._conn.request("stats", self._args())).result
        result["broker"] = self.address
        return result

    def count(self) -> int:
        return self._count

    async def fetch_count(self) -> int:
        self._count = int((await self._conn.request("count", self._args())).result)
        return self._count
