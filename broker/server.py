"""The broker: a ZeroMQ ROUTER in front of the same engine that embedded mode runs in-process.

One event loop. The socket is a plain (blocking-capable) ZeroMQ socket read with NOBLOCK from a loop reader
callback, not zmq.asyncio: that layer costs a future per recv and per send, which was most of the broker's CPU.
A request runs inline until it first has to wait (a group commit, a Lance read, a long-poll ``wait``); only then
does it become a task, so a long-poll never blocks a ``put`` while the common cheap requests cost no task.
Engine state lives on this loop only (the engine's own rule); Lance I/O goes to worker threads as in embedded
mode. Every request takes one route: its operation is looked up in the request table (requests/table.py), its
arguments decoded into that operation's struct, its handler awaited. A malformed request gets an error reply and
is counted (complaints.py: one log line per peer and interval); the broker keeps serving. Beside it: topics.py
(the open topics), tensor_memory.py (the arena), requests/ (the handlers), inline.py (a request's first step
without a task), replies.py (a request sent twice runs once), status.py and metrics.py (what operators see).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import zmq

from persisting.engine import Location, ObjectStoreTopic, Topic, object_store_topic, topic_dirname
from persisting.errors import ConfigError, PersistingError, ProtocolError, ProtocolVersionError
from persisting.wire import protocol, zsocket
from persisting.wire.protocol import Reply, Request
from persisting.wire.requests import Hello, TopicArgs

from . import complaints, givebacks, inline, status
from .complaints import Complaints
from .connections import Connections
from .peers import Peers
from .replies import RecentRequests
from .requests.context import Call
from .requests.table import TABLE, Route
from .tensor_memory import TensorMemory
from .topics import Topics

if TYPE_CHECKING:
    from persisting.tensors.arena import Peer

    from .metrics import BrokerMetrics

log = logging.getLogger("persisting.broker")

DRAIN_BATCH = 64  # messages taken per reader callback before other callbacks (fsync completions) get a turn


class Broker:
    def __init__(
        self,
        storage_path: Path,
        address: str,
        *,
        max_message_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
        backend_options: dict[str, Any] | None = None,
        socket_mode: int = 0o600,
        arena_bytes: int = 0,
        shm_budget: int | None = None,
        shm_dir: Path | None = None,
        metrics: bool = False,
        location: Location | None = None,
    ) -> None:
        self.storage_path = storage_path  # the local root (the whole storage unless location is an object store)
        self.location = location
        self.address = address
        self.max_message_bytes = max_message_bytes
        self.backend_options = dict(backend_options or {})
        self.socket_mode = socket_mode
        # The arena is readable and writable by whoever may use the socket (producers write into it).
        # Samples are served (get_meta/get_data) with or without an arena (arena_bytes 0: copies only).
        self.memory = TensorMemory(
            storage_path,
            arena_bytes,
            socket_mode,
            lambda: self._topics.open.values(),
            budget_bytes=shm_budget,
            **({} if shm_dir is None else {"shm_dir": shm_dir}),
        )
        self.memory.remote_for = self._remote_for
        self.flush_clock = status.FlushClock()
        hooks = (self._on_flushed, self._on_opened, self._remote_for)
        self._topics = Topics(storage_path, self.backend_options, self.memory.resolve, *hooks)
        self._tasks: set[asyncio.Task[None]] = set()
        self._recent = RecentRequests()  # requests re-sent by their client run once (replies.py)
        # what a hello answers but the arena's figures, without and with an arena: encoded once, on first use
        self._hello_info: list[protocol.FixedMap | None] = [None, None]
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_pending = False
        self._draining = False
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self.pid = os.getpid()
        self.started_at = time.time()
        # None with metrics off: the request path then pays one "is None" test (see metrics.py)
        self.metrics: BrokerMetrics | None = _metrics(self.state) if metrics else None
        self.connections = Connections()
        self.dedup = status.DedupCounts()  # bytes of deduped fields put vs stored, per topic (status, metrics)
        self.peers = Peers(address)  # who sent a request, from the kernel (arena space is never a client's word)
        self.complaints = Complaints(on_count=None if self.metrics is None else self.metrics.bad_frame)

    @property
    def topics(self) -> dict[str, Topic]:
        """The open topics by name (read-only use: the status map and metrics)."""
        return self._topics.open

    def arena_stats(self) -> dict[str, Any]:
        """The arena's figures ({} without one), for the status map."""
        return self.memory.stats()

    async def state(self) -> dict[str, Any]:
        """The status map (broker/status.py documents its keys); on the broker's loop."""
        return await status.snapshot(self)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Before bind(): re-adopt what a killed broker left in its arena, then reserve the arena."""
        await self.memory.start(self.backend_options)

    def bind(self) -> None:
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # ZeroMQ drops a larger message and resets that peer; clients check the limit (from hello) first.
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.connections.watch(sock, asyncio.get_running_loop())  # before bind: count every connection
        # The ipc socket file gets socket_mode: the service user only by default, 0660 for a group of clients.
        old_umask = os.umask(0o777 & ~self.socket_mode)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
            self.connections.close()  # its monitor socket too: an open one would hang the context's term()
            sock.close()
            raise ConfigError(f"cannot listen on {self.address}: {exc}") from exc
        finally:
            os.umask(old_umask)
        self._sock = sock

    def stop(self) -> None:
        """Stop taking requests; serve() then closes every topic (flushing it) and returns."""
        self._stop.set()

    async def serve(self) -> None:
        """Answer requests until stop(); then close every topic (flushing it) and the socket."""
        sock = self._sock
        if sock is None:
            raise RuntimeError("bind() first")
        loop = self._loop = asyncio.get_running_loop()
        fd = sock.fileno()
        loop.add_reader(fd, self._drain)
        self._kick()  # messages that arrived before the reader was added raise no new edge
        try:
            await self._stop.wait()
        finally:
            loop.remove_reader(fd)
            await self.close()

    def _kick(self) -> None:
        """Schedule one drain. ZeroMQ's FD is edge-triggered: after our own send or recv it may not fire again
        for a message that is already waiting, so whoever may have consumed an edge calls this."""
        if not self._drain_pending and self._loop is not None:
            self._drain_pending = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_pending = False
        sock = self._sock
        if sock is None or self._stop.is_set():
            return
        self._draining = True
        try:
            for _ in range(DRAIN_BATCH):
                try:
                    if not zsocket.readable(sock):
                        return
                    # The routing id as a Frame: it carries the sender's kernel credentials (peers.py).
                    first = zsocket.recv_first(sock)
                    frames = zsocket.recv_rest(sock, [first.bytes]) if first.more else [first.bytes]
                except zmq.Again:
                    return
                except zmq.ZMQError as exc:
                    log.warning("receiving from the socket failed: %s", exc)
                    return
                self._start(frames, self.peers.of(frames[0], first))
            self._kick()  # more may be queued; continue after the loop's other callbacks
        finally:
            self._draining = False

    def _start(self, frames: list[bytes], sender: Peer | None = None) -> None:
        # What needs no engine runs here, before any coroutine: the envelope's decode and its errors, a copy of a
        # request answered already. The request itself then runs inline: most (count, a read of buffered rows, a
        # put with durability="process", a hello) finish without ever suspending and need no task. One that
        # suspends continues as a task from where it stopped (what Python 3.12's eager tasks do).
        try:
            if len(frames) < 2:
                peer = frames[0].hex() if frames else "?"
                self.complaints.add(peer, complaints.MALFORMED, f"a message of {len(frames)} frame(s): no envelope")
                return
            identity, body = frames[0], frames[1:]
            try:
                req = protocol.decode_request(body)
            except ProtocolError as exc:
                self._complain(identity, exc)
                self._send([identity, *protocol.encode_reply(protocol.error_reply(inline.guess_id(body), exc))])
                return
            name = (identity, req.id)
            route = TABLE[req.op]  # decode_request lets known operations only through
            if route.cached:
                answered = self._recent.answered(name)
                if answered is not None:
                    self._send([identity, *answered])  # a copy of a request answered already: the same answer
                    return
                if not self._recent.start(name):
                    return  # a copy of a request still running: that one answers
            task = inline.start(self._handle(identity, req, route, sender))
        except Exception:
            log.exception("a request failed outside its error handling")
            return
        if task is None:
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, frames: list[bytes]) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            # A ROUTER never blocks: a reply to a peer that is gone (or over its high-water mark) is dropped,
            # and that client re-sends its request.
            zsocket.send(sock, frames)
        except zmq.ZMQError as exc:
            log.warning("could not send a reply: %s", exc)
        if not self._draining and zsocket.readable(sock):
            self._kick()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self._topics.close()
        await self.memory.close()  # every topic is flushed: no extent is needed any more
        self.complaints.close()
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
            self.connections.close()
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self.address.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address[len("ipc://") :])

    # -- requests -----------------------------------------------------------------------------------

    async def _handle(self, identity: bytes, req: Request, route: Route, sender: Peer | None = None) -> None:
        """Run a decoded request on its route (requests/table.py) and send its reply; ``_start`` marked it running
        in the reply cache if the route's replies are cached."""
        name = (identity, req.id)
        metrics = self.metrics
        started = time.perf_counter() if metrics is not None else 0.0
        cached = route.cached
        call: Call[Any] | None = None
        try:
            args = route.decode(req.args)
            topic = None
            if route.topic:
                topic_args = cast(TopicArgs, args)  # (or SampleArgs: both name a topic and its config)
                topic = self._topics.opened(topic_args.topic, topic_args.config)
                if topic is None:
                    topic = await self._topics.get(topic_args.topic, topic_args.config)
            call = self._call(route.givebacks, req, args, sender, topic, identity)
            reply = await route.handler(self, call)
        except ProtocolError as exc:
            self._complain(identity, exc)
            reply = protocol.error_reply(req.id, exc)
        except PersistingError as exc:
            reply = protocol.error_reply(req.id, exc)
        except asyncio.CancelledError:
            if cached:
                self._recent.abandon(name)
            raise
        except Exception as exc:
            odd = protocol.plain(req.args)  # msgspec decodes what msgpack's strict mode refused: name it
            if odd is None:
                log.exception("request %d failed", req.id)
                reply = protocol.error_reply(req.id, exc)
            else:
                bad = ProtocolError(f"operation {req.op!r}: its args hold {odd}")
                self._complain(identity, bad)
                reply = protocol.error_reply(req.id, bad)
        if call is not None:
            if metrics is not None:
                metrics.request(call, reply, time.perf_counter() - started)
            if route.dedup_counted:
                self.dedup.request(call.args, reply)
        out = protocol.encode_reply(reply)
        if cached:
            self._recent.done(name, out)
        self._send([identity, *out])

    def _call(
        self, givebacks_ride: bool, req: Request, args: Any, sender: Peer | None, topic: Topic | None, identity: bytes
    ) -> Call[Any]:
        """The request as its handler gets it, after what rides along on it is given back."""
        memory = self.memory
        if givebacks_ride and memory.extents is not None:
            givebacks.apply(args, memory.extents, memory.arena, sender)
        return Call(req.id, req.op, args, req.buffers, sender, topic, identity)

    async def _dispatch(self, req: Request, sender: Peer | None = None) -> Reply:
        """A request answered without the socket, errors raised (in-process callers: bench/probes/samples_cpu.py)."""
        route = TABLE[req.op]
        args = route.decode(req.args)
        topic = None
        if route.topic:
            topic_args = cast(TopicArgs, args)
            topic = await self._topics.get(topic_args.topic, topic_args.config)
        return await route.handler(self, self._call(route.givebacks, req, args, sender, topic, b""))

    def hello(self, call: Call[Any]) -> Reply:
        """A hello: it changes nothing but the list of clients, so a copy sent twice may run twice (no reply
        cache). What it tells is fixed for the broker's life except the arena's figures."""
        sender = call.peer
        args: Hello = call.args
        # listed under the kernel's pid where there is one
        self.connections.hello(call.identity, args.peer, sender)
        fixed = self._hello_info[sender is not None]
        if fixed is None:
            fixed = self._hello_info[sender is not None] = protocol.FixedMap(
                {
                    "broker": "persisting",
                    "pid": self.pid,
                    "storage_path": self.location.describe() if self.location else str(self.storage_path),
                    "max_message_bytes": self.max_message_bytes,
                    "arena": self.memory.hello() if sender is not None else {},  # no process the kernel names: copies
                    "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],  # uvloop or asyncio
                    "features": ["riders"],  # beyond the protocol version (requests/riders.py)
                }
            )
        return call.ok(fixed.with_entry("arena_stats", self.memory.stats()))

    def _complain(self, identity: bytes, exc: ProtocolError) -> None:
        if isinstance(exc, ProtocolVersionError):
            kind = complaints.VERSION
        elif "envelope" in str(exc) or "empty message" in str(exc):
            kind = complaints.MALFORMED
        else:
            kind = complaints.BAD_REQUEST
        self.complaints.add(identity.hex(), kind, str(exc))

    def _on_opened(self, topic_name: str) -> None:
        self.flush_clock.opened(topic_name)
        self.memory.kept.adopted(topic_name)  # its open flushed what it replayed from kept payloads

    def _on_flushed(self, topic_name: str, flushed_upto: int) -> None:
        self.memory.on_flushed(topic_name, flushed_upto)
        if self._loop is not None:
            # The engine updates its flush counters right after this callback, in the same loop step.
            self._loop.call_soon(self._observe_flush, topic_name)

    def _observe_flush(self, topic_name: str) -> None:
        topic = self._topics.open.get(topic_name)
        if topic is None:
            return
        self.flush_clock.flushed(topic_name, topic.count() - topic.flushed_upto)
        if self.metrics is not None:
            m = topic.metrics
            self.metrics.flushed(topic_name, m.flushes, m.flush_seconds, m.records_flushed)

    def _remote_for(self, name: str) -> ObjectStoreTopic | None:
        return None if self.location is None else object_store_topic(self.location, name, topic_dirname(name))


def _metrics(state: Any) -> BrokerMetrics:
    try:
        from .metrics import BrokerMetrics
    except ImportError as exc:
        raise ConfigError(
            "--metrics needs prometheus_client (a dependency of persisting): pip install prometheus-client"
        ) from exc
    return BrokerMetrics(state)
