"""The topics a broker serves and their record operations: a topic is opened by the first request naming it (with
the settings it asks for, checked against the open topic's after), then ``put_batch``, ``read`` (a long-poll with
``wait``), ``wait``, ``flush``, ``stats`` and ``count`` drive it through the engine's interface."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from persisting.engine import DURABILITY_MODES, ArenaResolver, ObjectStoreTopic, Topic, TopicConfig
from persisting.errors import ConfigError, ProtocolError
from persisting.storage.lance_backend import LanceBackend
from persisting.wire import codec, protocol, row_checks
from persisting.wire.protocol import Reply, Request, arg

CONFIGS_KEPT = 256  # distinct topic configs remembered as checked

log = logging.getLogger("persisting.broker")

_CONFIG_KEYS: dict[str, type | tuple[type, ...]] = {
    "num_buckets": int,
    "bucket_column": str,
    "batch_size": int,
    "auto_flush_interval_sec": (int, float),
    "durability": str,
}


class Topics:
    """The open topics of a broker by name; their one owner (the status map and the plane read them)."""

    def __init__(
        self,
        storage_path: Path,
        backend_options: dict[str, Any],
        resolver: ArenaResolver,
        on_flushed: Callable[[str, int], None],
        on_opened: Callable[[str], None],
        remote_for: Callable[[str], ObjectStoreTopic | None],
    ) -> None:
        self._storage_path = storage_path
        self._backend_options = backend_options
        self._resolver = resolver
        self._on_flushed = on_flushed
        self._on_opened = on_opened
        self._remote_for = remote_for  # an object-store topic's lease and settings (None: local storage)
        self.open: dict[str, Topic] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._configs: dict[tuple[Any, ...], TopicConfig] = {}  # checked configs, by the request's config items

    def _config_of(self, raw: dict[str, Any]) -> TopicConfig:
        """The request's topic config, checked; a client sends the same one with every request, so the check
        (a TopicConfig built and validated, several microseconds) runs once per distinct config."""
        try:
            key = tuple([(k, type(v), v) for k, v in raw.items()])  # True == 1, but only 1 is a valid int
            config = self._configs.get(key)
        except TypeError:  # an unhashable value: checked (and refused) below
            key, config = (), None
        if config is None:
            config = _topic_config(raw, self._backend_options)
            if key and len(self._configs) < CONFIGS_KEPT:
                self._configs[key] = config
        return config

    async def get(self, req: Request) -> Topic:
        """The topic ``req`` names, opened with the settings it asks for if it is not open yet."""
        name, raw = req.args.get("topic"), req.args.get("config")
        if type(name) is not str or type(raw) is not dict:
            name, raw = arg(req, "topic", str), arg(req, "config", dict)
        config = self._config_of(raw)
        topic = self.open.get(name)
        if topic is None:
            lock = self._opening.setdefault(name, asyncio.Lock())
            async with lock:
                topic = self.open.get(name)
                if topic is None:
                    if not name or "\x00" in name:
                        raise ConfigError(f"invalid topic name {protocol.shown(name)}")
                    topic = Topic(
                        name,
                        self._storage_path,
                        config,
                        LanceBackend,
                        arena_resolver=self._resolver,
                        on_flushed=self._on_flushed,
                        remote=self._remote_for(name),
                    )
                    try:
                        await topic.open()
                    except BaseException:
                        await topic.close_quietly()
                        raise
                    self.open[name] = topic
                    self._on_opened(name)
                    log.info("opened topic %s (%d records)", protocol.shown(name), topic.count())
        if config is topic.config:  # the checked config it was opened with (one per distinct config, above)
            return topic
        for key in ("num_buckets", "bucket_column", "durability"):
            if getattr(topic.config, key) != getattr(config, key):
                raise ConfigError(
                    f"topic {name!r} is open with {key}={getattr(topic.config, key)!r}; "
                    f"this client asks for {getattr(config, key)!r}"
                )
        return topic

    async def close(self) -> None:
        """Close every topic (each flushes first)."""
        for name, topic in list(self.open.items()):
            try:
                await topic.close()
            except Exception:
                log.exception("closing topic %r failed (its write-ahead log keeps every acknowledged row)", name)
        self.open.clear()


async def handle(req: Request, topic: Topic) -> Reply | None:
    """A record operation on ``topic`` (None: ``req.op`` is none of them)."""
    if req.op == "put_batch":
        return await put_batch(req, topic)
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
    return None


async def put_batch(req: Request, topic: Topic) -> Reply:
    """``put_batch``: rows appended to ``topic`` (its arguments' types tested inline, ``arg`` words a refusal)."""
    args = req.args
    partition, kinds, count, key = args.get("partition"), args.get("kinds"), args.get("count"), args.get("key")
    if type(partition) is not str or type(kinds) is not dict or type(count) is not int:
        partition, kinds, count = arg(req, "partition", str), arg(req, "kinds", dict), arg(req, "count", int)
    batch = encoded_rows(req, kinds, count, key, "put_batch")
    first, n = await topic.append(batch, partition, req.buffers[0], key, of=None if "of" not in args else _targets(req))
    return Reply(req.id, True, [first, n])


def encoded_rows(req: Request, kinds: dict[str, Any], count: int, key: Any, what: str) -> codec.EncodedBatch:
    """The request's one buffer of msgpack rows, checked against ``kinds`` and ``count`` (``what``: the put's name
    in errors: ``put_batch``, or a put riding on another request, broker/riders.py)."""
    if len(req.buffers) != 1 or (key is not None and not isinstance(key, str)):
        raise ProtocolError(f"{what} needs one rows buffer and a str key (or none)")
    try:
        rows = msgpack.unpackb(req.buffers[0], raw=False, use_list=True)
    except Exception as exc:
        raise ProtocolError(f"{what} rows are not valid msgpack: {exc}") from exc
    return codec.EncodedBatch(row_checks.check_rows(rows, kinds, count), kinds)


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
                raise ProtocolError(f"topic config {key!r} has the wrong type: {protocol.shown(raw[key])}")
            values[key] = raw[key]
    if values.get("durability", "sync") not in DURABILITY_MODES:
        raise ConfigError(f"durability must be one of {DURABILITY_MODES}")
    config = TopicConfig(**values, backend_kwargs=backend_options)
    config.validate()
    return config
