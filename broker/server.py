"""The broker: a ZeroMQ ROUTER in front of the same engine that embedded mode runs in-process.

Every request is handled in its own task on one event loop, so a long-poll ``wait`` never blocks a ``put``.
Engine state lives on this loop only (the engine's own rule); Lance I/O goes to worker threads as in embedded
mode. A malformed request gets an error reply and a log line; the broker keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from persisting import codec, protocol
from persisting.config import DURABILITY_MODES, TopicConfig
from persisting.engine import Topic
from persisting.errors import ConfigError, PersistingError, ProtocolError
from persisting.protocol import Reply, Request, arg
from persisting.queue.lance_backend import LanceBackend

from .plane import OPS as PLANE_OPS
from .plane import TensorPlane

log = logging.getLogger("persisting.broker")

WAIT_SLICE_SECONDS = 30.0  # a wait longer than this is answered "not yet" and re-sent by the client
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
    ) -> None:
        self.storage_path = storage_path
        self.address = address
        self.max_message_bytes = max_message_bytes
        self.backend_options = dict(backend_options or {})
        self.socket_mode = socket_mode
        # The arena is readable and writable by whoever may use the socket (producers write into it).
        self.plane = TensorPlane(storage_path, arena_bytes, socket_mode) if arena_bytes else None
        self._topics: dict[str, Topic] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._serving: asyncio.Task[Any] | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Before bind(): re-adopt what a killed broker left in its arena, then reserve the arena."""
        if self.plane is not None:
            await self.plane.start(self.backend_options)

    def bind(self) -> None:
        self._ctx = zmq.asyncio.Context()
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
        if self._serving is not None:
            self._serving.cancel()

    async def serve(self) -> None:
        """Answer requests until stop(); then close every topic (flushing it) and the socket."""
        sock = self._sock
        if sock is None:
            raise RuntimeError("bind() first")
        self._serving = asyncio.current_task()
        try:
            while not self._stop.is_set():
                frames = await sock.recv_multipart()
                task = asyncio.ensure_future(self._handle(frames))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except asyncio.CancelledError:
            if not self._stop.is_set():
                raise
        finally:
            self._serving = None
            await self.close()

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
        if self.plane is not None:
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
        request_id = 0
        try:
            req = protocol.decode_request(body)
            request_id = req.id
            reply = await self._dispatch(req)
        except ProtocolError as exc:
            log.warning("bad request from client %s: %s", identity.hex(), exc)
            reply = protocol.error_reply(_guess_id(body), exc)
        except PersistingError as exc:
            reply = protocol.error_reply(request_id, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("request %d failed", request_id)
            reply = protocol.error_reply(request_id, exc)
        if self._sock is not None:
            await self._sock.send_multipart([identity, *protocol.encode_reply(reply)])

    async def _dispatch(self, req: Request) -> Reply:
        if req.op == "hello":
            info = {
                "broker": "persisting",
                "pid": os.getpid(),
                "storage_path": str(self.storage_path),
                "max_message_bytes": self.max_message_bytes,
                "arena": self.plane.hello() if self.plane is not None else {},
                "arena_stats": self.plane.stats() if self.plane is not None else {},
            }
            return Reply(req.id, True, info)
        if req.op == "topics":
            return Reply(req.id, True, [await t.stats() for t in self._topics.values()])
        if req.op in ("lease", "release"):
            if self.plane is None:
                raise ConfigError("this broker runs without an arena (--arena-bytes 0)")
            return await self.plane.handle(req, None)
        topic = await self._topic(req)
        if req.op in PLANE_OPS:
            if self.plane is None:
                raise ConfigError("this broker runs without an arena (--arena-bytes 0)")
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
            first, n = await topic.append(batch, partition, req.buffers[0], key)
            return Reply(req.id, True, [first, n])
        if req.op == "read":
            rows, kinds = await topic.read(arg(req, "offset", int), arg(req, "limit", int))
            result = {"kinds": kinds, "count": topic.count()}
            return Reply(req.id, True, result, buffers=[codec.pack(rows)])
        if req.op == "wait":
            timeout = req.args.get("timeout")
            if timeout is not None and not isinstance(timeout, int | float):
                raise ProtocolError("wait timeout must be a number or nil")
            limit = WAIT_SLICE_SECONDS if timeout is None else min(float(timeout), WAIT_SLICE_SECONDS)
            return Reply(req.id, True, await topic.wait_beyond(arg(req, "index", int), limit))
        if req.op == "flush":
            await topic.flush()
            return Reply(req.id, True, None)
        if req.op == "stats":
            return Reply(req.id, True, await topic.stats())
        if req.op == "count":
            return Reply(req.id, True, topic.count())
        raise ProtocolError(f"unknown operation {req.op!r}")

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
                    plane = self.plane
                    topic = Topic(
                        name,
                        self.storage_path,
                        config,
                        LanceBackend,
                        arena_resolver=plane.resolve if plane is not None else None,
                        on_flushed=plane.on_flushed if plane is not None else None,
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


def _guess_id(body: list[bytes]) -> int:
    """The request id of a message that failed to decode, when it can be read at all (else 0)."""
    with contextlib.suppress(Exception):
        env = msgpack.unpackb(body[0], raw=False)
        if isinstance(env, dict) and isinstance(env.get("id"), int):
            return int(env["id"])
    return 0
