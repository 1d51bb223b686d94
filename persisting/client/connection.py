"""Broker mode's transport: one DEALER socket per (event loop, broker), requests with retries and reconnects.

Retries: a request that gets no reply is re-sent with the same request id every ``RESEND_SECONDS`` until its
timeout. A ``put_batch`` carries an idempotency key, so a re-sent (or late-delivered) put is stored once even
across a broker restart. After the timeout the call raises ``BrokerUnavailableError``. Error replies become the
exception they name (``persisting.errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from .. import errors
from ..engine import inline
from ..wire import protocol, zsocket
from ..wire.protocol import WAIT_SLICE_SECONDS, Reply, Request
from . import blocking
from .bad_replies import BadReplies

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = float(os.environ.get("PERSISTING_REQUEST_TIMEOUT", "30"))
RESEND_SECONDS = 2.0
VIEWED_FRAME_BYTES = 1024 * 1024  # a reply frame at least this big is kept as a view of its message, not copied

_RETRIES = blocking.Retries(RESEND_SECONDS, VIEWED_FRAME_BYTES)  # what a blocking caller's socket does the same

# One DEALER per (event loop, broker address): a RemoteTopic is driven from its caller's loop, with no hop to
# the background loop (a thread hop costs about as much as the ZeroMQ round trip itself).
_connections: dict[tuple[int, str], tuple[asyncio.AbstractEventLoop, Connection]] = {}


def _forget_connections() -> None:
    _connections.clear()  # sockets do not survive fork; a child connects anew


os.register_at_fork(after_in_child=_forget_connections)


@dataclass(slots=True)
class _Waiting:
    """A request sent and not answered yet."""

    fut: asyncio.Future[Reply]
    frames: list[bytes]
    due: float  # loop time of its next re-send
    deadline: float  # loop time it fails at (BrokerUnavailableError)
    op: str
    limit: float  # its timeout in seconds, for the error message


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
        self._waiting: dict[int, _Waiting] = {}  # request id -> the request, while it waits for its reply
        # One timer for every waiting request (re-sends and timeouts), set for the earliest due one: a request
        # answered in time (nearly all) then costs no timer of its own.
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_pending = False
        self.max_message_bytes = protocol.DEFAULT_MAX_MESSAGE_BYTES
        self._bad = BadReplies(address)
        # (Arena holds whose views died are a process's, not a connection's: releases.py.)

    def close(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._sock.fileno())
            loop.remove_reader(self._monitor.fileno())
        self._loop = None
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep, self._sweep_at = None, math.inf
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
                log.info("reconnected to %s; sending %d waiting request(s) again", self.address, len(self._waiting))
                for waiting in list(self._waiting.values()):
                    if not waiting.fut.done():
                        self._send(waiting.frames)

    def _kick(self) -> None:
        # ZeroMQ's FD is edge-triggered: a send may consume the edge of a reply that is already waiting.
        if not self._drain_pending and self._loop is not None:
            self._drain_pending = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_pending = False
        sock = self._sock
        while True:
            try:
                if not zsocket.readable(sock):
                    return
                frames = zsocket.recv_viewing(sock, VIEWED_FRAME_BYTES)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # the socket was closed under us
                log.debug("receiving from %s stopped: %s", self.address, exc)
                return
            reply = self._bad.decode(frames)
            if reply is None:
                continue
            waiting = self._waiting.get(reply.id)
            if waiting is not None and not waiting.fut.done():
                waiting.fut.set_result(reply)

    def _send(self, frames: list[bytes]) -> None:
        # zmq.Again: the queue to the broker is full (it is down or stalled); the resend timer tries again.
        with contextlib.suppress(zmq.Again):
            zsocket.send(self._sock, frames)
        if zsocket.readable(self._sock):
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
        size = len(frames[0]) + sum(map(len, buffers)) if buffers else len(frames[0])
        if size > self.max_message_bytes:
            raise errors.InvalidRecordError(
                f"this {op} request is {size} bytes, over the broker's limit of {self.max_message_bytes}; "
                "split the batch (or raise the broker's max message size)"
            )
        limit = timeout or hold + REQUEST_TIMEOUT_SECONDS  # a held request may answer only after its hold
        if inline.blocking_allowed():  # a blocking caller's step: its own socket, no hand-off (blocking.py)
            return raise_for(blocking.socket_for(self.address).request(frames, req.id, op, limit, hold, _RETRIES))
        loop = asyncio.get_running_loop()
        self._watch(loop)
        fut: asyncio.Future[Reply] = loop.create_future()
        now = loop.time()
        waiting = _Waiting(fut, frames, now + min(hold + RESEND_SECONDS, limit), now + limit, op, limit)
        self._waiting[req.id] = waiting
        self._send(frames)
        if waiting.due < self._sweep_at:
            self._sweep_soon(loop, waiting.due)
        try:
            return raise_for(await fut)
        finally:
            self._waiting.pop(req.id, None)

    def _sweep_soon(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep, self._sweep_at = loop.call_at(when, self._resend_due, loop), when

    def _resend_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Re-send each waiting request that is due (ZeroMQ queues it until the broker is back); fail those past
        their timeout; then wait for the next one due."""
        self._sweep, self._sweep_at = None, math.inf
        now, earliest = loop.time(), math.inf
        for waiting in list(self._waiting.values()):
            if waiting.fut.done():
                continue
            if now >= waiting.deadline:
                waiting.fut.set_exception(
                    errors.BrokerUnavailableError(
                        f"no reply from the broker at {self.address} to {waiting.op!r} within {waiting.limit:.0f} s; "
                        "is persisting-broker running there?"
                    )
                )
                continue
            if now >= waiting.due:
                self._send(waiting.frames)
                waiting.due = now + min(RESEND_SECONDS, waiting.deadline - now)
            earliest = min(earliest, waiting.due)
        if earliest < math.inf:
            self._sweep_soon(loop, earliest)

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
    name: getattr(errors, name)
    for name in errors.__all__
    if name not in ("SchemaConflictError", "PayloadClearedError", "DedupConflictError", "RemoteError")
}


def raise_for(reply: Reply) -> Reply:
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
    if reply.error_type == "PayloadClearedError":
        rows = reply.error_details.get("rows", "")
        raise errors.PayloadClearedError(reply.error_message, [int(r) for r in rows.split(",") if r.isdigit()])
    if reply.error_type == "DedupConflictError":
        d = reply.error_details
        raise errors.DedupConflictError(reply.error_message, str(d.get("field", "")), bool(d.get("deduped")))
    raise errors.RemoteError(reply.error_type, reply.error_message)
