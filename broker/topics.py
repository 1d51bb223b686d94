"""The topics a broker serves: a topic is opened by the first request naming it, with the settings it asks for
(checked against the open topic's on every later request); the requests then drive it through the engine's
interface (broker/requests/)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from persisting.engine import DURABILITY_MODES, ArenaResolver, ObjectStoreTopic, Topic, TopicConfig
from persisting.errors import ConfigError, ProtocolError
from persisting.storage.lance_backend import LanceBackend
from persisting.wire import protocol

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
    """The open topics of a broker by name; their one owner (the status map and the arena read them)."""

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
        self._configs: dict[bytes, TopicConfig] = {}  # checked configs, by their msgpack bytes

    def _config_of(self, raw: msgspec.Raw) -> TopicConfig:
        """The request's topic config (its msgpack map, as sent), checked; a client sends the same bytes with every
        request, so the decode and the check (a TopicConfig built and validated, several microseconds) run once
        per distinct config. (Its bytes tell True from 1, which compare equal: only 1 is a valid int.)"""
        key = bytes(raw)
        config = self._configs.get(key)
        if config is None:
            try:
                values = protocol.loads(key)
            except Exception as exc:
                raise ProtocolError(f"topic config is not valid msgpack: {protocol.shown(str(exc))}") from exc
            if not isinstance(values, dict):
                raise ProtocolError(f"topic config must be a map, got {protocol.shown(values)}")
            config = _topic_config(values, self._backend_options)
            if len(self._configs) < CONFIGS_KEPT:
                self._configs[key] = config
        return config

    def opened(self, name: str, raw: msgspec.Raw) -> Topic | None:
        """The topic ``name`` if it is open with the settings ``raw`` asks for, without a coroutine (the common
        case: each request of a client names a topic open with its config); None: ask ``get``."""
        topic = self.open.get(name)
        if topic is not None and self._config_of(raw) is topic.config:
            return topic
        return None

    async def get(self, name: str, raw: msgspec.Raw) -> Topic:
        """The topic ``name``, opened with the settings ``raw`` asks for if it is not open yet."""
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
