"""The broker: a ZeroMQ ROUTER in front of the same engine that embedded mode runs in-process.

One event loop. The socket is a plain (blocking-capable) ZeroMQ socket read with NOBLOCK from a loop reader
callback, not zmq.asyncio: that layer costs a future per recv and per send, which was most of the broker's CPU.
A request runs inline until it first has to wait (a group commit, a Lance read, a long-poll ``wait``); only then
does it become a task, so a long-poll never blocks a ``put`` while the common cheap requests cost no task.
Engine state lives on this loop only (the engine's own rule); Lance I/O goes to worker threads as in embedded
mode. A malformed request gets an error reply and a log line; the broker keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any

import msgpack
import zmq

from persisting.engine.config import DURABILITY_MODES, TopicConfig
from persisting.engine.layout import topic_dirname
from persisting.engine.location import Location, ObjectStoreTopic, object_store_topic
from persisting.engine.topic import Topic
from persisting.errors import ConfigError, PersistingError, ProtocolError
from persisting.queue.lance_backend import LanceBackend
from persisting.wire import codec, protocol
from persisting.wire.protocol import Reply, Request, arg

from .plane import OPS as PLANE_OPS
from .plane import TensorPlane
from .replies import RecentRequests

log = logging.getLogger("persisting.broker")

DRAIN_BATCH = 64  # messages taken per reader callback before other callbacks (fsync completions) get a turn
_CONFIG_KEYS: dict[str, type | tuple[type, ...]] = {
    "num_buckets": int,
    "bucket_column": str,
    "batch_size": int,
    "auto_flush_interval_sec": (int, float),
    "durability": str,
}


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
        location: Location | None = None,
    ) -> None:
        self.storage_path = storage_path  # the local root (the whole storage unless location is an object store)
        self.location = location
        self.address = address
        self.max_message_bytes = max_message_bytes
        self.backend_options = dict(backend_options or {})
        self.socket_mode = socket_mode
        # The arena is readable and writable by whoever may use the socket (producers write into it).
        # The plane serves samples (get_meta/get_data) with or without an arena (arena_bytes 0: copies only).
        self.plane = TensorPlane(storage_path, arena_bytes, socket_mode, lambda: self._topics.values())
        self.plane.remote_for = self._remote_for
        self._topics: dict[str, Topic] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._recent = RecentRequests()  # requests re-sent by their client run once (replies.py)
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_pending = False
        self._draining = False
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Before bind(): re-adopt what a killed broker left in its arena, then reserve the arena."""
        await self.plane.start(self.backend_options)

    def bind(self) -> None:
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # ZeroMQ drops a larger message and resets that peer; clients check the limit (from hello) first.
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # The ipc socket file gets socket_mode: the service user only by default, 0660 for a group of clients.
        old_umask = os.umask(0o777 & ~self.socket_mode)
        try:
            sock.bind(self.address)
        except zmq.ZMQError as exc:
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
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                except zmq.ZMQError as exc:
                    log.warning("receiving from the socket failed: %s", exc)
                    return
                self._start(frames)
            self._kick()  # more may be queued; continue after the loop's other callbacks
        finally:
            self._draining = False

    def _start(self, frames: list[bytes]) -> None:
        # The request's first step runs here, inline: most requests (hello, count, a read of buffered rows, a
        # put with durability="process") finish without ever suspending and need no task. One that suspends
        # continues as a task from where it stopped (what Python 3.12's eager tasks do).
        coro = self._handle(frames)
        try:
            first = coro.send(None)
        except StopIteration:
            return
        except Exception:
            log.exception("a request failed outside its error handling")
            return
        task = asyncio.ensure_future(_finish(_Resumed(coro, first)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, frames: list[bytes]) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            # A ROUTER never blocks: a reply to a peer that is gone (or over its high-water mark) is dropped,
            # and that client re-sends its request.
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("could not send a reply: %s", exc)
        if not self._draining and int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._kick()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for name, topic in list(self._topics.items()):
            try:
                await topic.close()
            except Exception:
                log.exception("closing topic %r failed (its write-ahead log keeps every acknowledged row)", name)
        self._topics.clear()
        await self.plane.close()  # every topic is flushed: no extent is needed any more
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self.address.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address[len("ipc://") :])

    # -- requests -----------------------------------------------------------------------------------

    async def _handle(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            log.warning("dropping a message of %d frame(s): no envelope", len(frames))
            return
        identity, body = frames[0], frames[1:]
        try:
            req = protocol.decode_request(body)
        except ProtocolError as exc:
            log.warning("bad request from client %s: %s", identity.hex(), exc)
            self._send([identity, *protocol.encode_reply(protocol.error_reply(_guess_id(body), exc))])
            return
        name = (identity, req.id)
        answered = self._recent.answered(name)
        if answered is not None:
            self._send([identity, *answered])  # a copy of a request answered already: the same answer
            return
        if not self._recent.start(name):
            return  # a copy of a request still running: that one answers
        try:
            reply = await self._dispatch(req)
        except ProtocolError as exc:
            log.warning("bad request from client %s: %s", identity.hex(), exc)
            reply = protocol.error_reply(req.id, exc)
        except PersistingError as exc:
            reply = protocol.error_reply(req.id, exc)
        except asyncio.CancelledError:
            self._recent.abandon(name)
            raise
        except Exception as exc:
            log.exception("request %d failed", req.id)
            reply = protocol.error_reply(req.id, exc)
        out = protocol.encode_reply(reply)
        self._recent.done(name, out)
        self._send([identity, *out])

    async def _dispatch(self, req: Request) -> Reply:
        if req.op == "hello":
            info = {
                "broker": "persisting",
                "pid": os.getpid(),
                "storage_path": self.location.describe() if self.location else str(self.storage_path),
                "max_message_bytes": self.max_message_bytes,
                "arena": self.plane.hello(),
                "arena_stats": self.plane.stats(),
            }
            return Reply(req.id, True, info)
        if req.op == "topics":
            return Reply(req.id, True, [await t.stats() for t in self._topics.values()])
        if req.op in ("lease", "release"):
            return await self.plane.handle(req, None)
        topic = await self._topic(req)
        if req.op in PLANE_OPS:
            return await self.plane.handle(req, topic)
        if req.op == "put_batch":
            partition = arg(req, "partition", str)
            kinds = arg(req, "kinds", dict)
            count = arg(req, "count", int)
            key = req.args.get("key")
            if len(req.buffers) != 1 or (key is not None and not isinstance(key, str)):
                raise ProtocolError("put_batch needs one rows buffer and a str key (or none)")
            try:
                rows = msgpack.unpackb(req.buffers[0], raw=False, use_list=True)
            except Exception as exc:
                raise ProtocolError(f"put_batch rows are not valid msgpack: {exc}") from exc
            batch = codec.EncodedBatch(codec.check_rows(rows, kinds, count), kinds)
            first, n = await topic.append(batch, partition, req.buffers[0], key, of=_targets(req))
            return Reply(req.id, True, [first, n])
        if req.op == "read":
            offset, limit = arg(req, "offset", int), arg(req, "limit", int)
            wait = _timeout(req, "wait")
            rows, kinds, end = await topic.read_window(offset, limit)
            # A read with "wait" is a long-poll: a consumer at the end of the data gets its next page in one
            # round trip instead of read, wait, read. "waited" tells the client this broker honoured it.
            if (
                end <= offset
                and wait is not None
                and limit > 0
                and await topic.wait_beyond(offset, min(wait, protocol.WAIT_SLICE_SECONDS))
            ):
                rows, kinds, end = await topic.read_window(offset, limit)
            result = {"kinds": kinds, "count": topic.count(), "waited": wait is not None, "end": end}
            return Reply(req.id, True, result, buffers=[codec.pack(rows)])
        if req.op == "wait":
            timeout = _timeout(req, "timeout")
            limit = protocol.WAIT_SLICE_SECONDS if timeout is None else min(timeout, protocol.WAIT_SLICE_SECONDS)
            return Reply(req.id, True, await topic.wait_beyond(arg(req, "index", int), limit))
        if req.op == "flush":
            await topic.flush()
            return Reply(req.id, True, None)
        if req.op == "stats":
            return Reply(req.id, True, await topic.stats())
        if req.op == "count":
            return Reply(req.id, True, topic.count())
        raise ProtocolError(f"unknown operation {req.op!r}")

    def _remote_for(self, name: str) -> ObjectStoreTopic | None:
        return None if self.location is None else object_store_topic(self.location, name, topic_dirname(name))

    async def _topic(self, req: Request) -> Topic:
        name = arg(req, "topic", str)
        raw = arg(req, "config", dict)
        config = _topic_config(raw, self.backend_options)
        topic = self._topics.get(name)
        if topic is None:
            lock = self._opening.setdefault(name, asyncio.Lock())
            async with lock:
                topic = self._topics.get(name)
                if topic is None:
                    if not name or "\x00" in name:
                        raise ConfigError(f"invalid topic name {name!r}")
                    topic = Topic(
                        name,
                        self.storage_path,
                        config,
                        LanceBackend,
                        arena_resolver=self.plane.resolve,
                        on_flushed=self.plane.on_flushed,
                        remote=self._remote_for(name),
                    )
                    try:
                        await topic.open()
                    except BaseException:
                        await topic.close_quietly()
                        raise
                    self._topics[name] = topic
                    log.info("opened topic %r (%d records)", name, topic.count())
        for key in ("num_buckets", "bucket_column", "durability"):
            if getattr(topic.config, key) != getattr(config, key):
                raise ConfigError(
                    f"topic {name!r} is open with {key}={getattr(topic.config, key)!r}; "
                    f"this client asks for {getattr(config, key)!r}"
                )
        return topic


def _targets(req: Request) -> list[int] | None:
    """The samples a patch put writes fields of (``of``), or None for new samples."""
    of = req.args.get("of")
    if of is None:
        return None
    if not isinstance(of, list) or not all(type(i) is int and i >= 0 for i in of):
        raise ProtocolError(f"{req.op} of must be a list of global indexes (ints >= 0)")
    return of


def _timeout(req: Request, name: str) -> float | None:
    """An optional number of seconds (nil: absent); negative counts as zero."""
    value = req.args.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProtocolError(f"{req.op} {name} must be a number or nil")
    return max(0.0, float(value))


def _topic_config(raw: dict[str, Any], backend_options: dict[str, Any]) -> TopicConfig:
    values: dict[str, Any] = {}
    for key, kind in _CONFIG_KEYS.items():
        if key in raw:
            if not isinstance(raw[key], kind) or isinstance(raw[key], bool):
                raise ProtocolError(f"topic config {key!r} has the wrong type: {raw[key]!r}")
            values[key] = raw[key]
    if values.get("durability", "sync") not in DURABILITY_MODES:
        raise ConfigError(f"durability must be one of {DURABILITY_MODES}")
    config = TopicConfig(**values, backend_kwargs=backend_options)
    config.validate()
    return config


class _Resumed:
    """An awaitable that carries on a coroutine whose first step already ran and yielded ``first``."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, None]:
        coro, value = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield value  # the Task driving us sees exactly what the coroutine yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation (or anything thrown in) goes on into the coroutine
                try:
                    value = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    value = coro.send(sent)
                except StopIteration:
                    return


async def _finish(resumed: _Resumed) -> None:
    await resumed


def _guess_id(body: list[bytes]) -> int:
    """The request id of a message that failed to decode, when it can be read at all (else 0)."""
    with contextlib.suppress(Exception):
        env = msgpack.unpackb(body[0], raw=False)
        if isinstance(env, dict) and isinstance(env.get("id"), int):
            return int(env["id"])
    return 0
