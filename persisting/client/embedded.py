"""Embedded mode on the client side: ``EmbeddedTopic``, the engine's ``Topic`` in this process as a ``TopicAPI``.

The engine runs on the one engine loop (``_loop.py``); each method here hands its engine coroutine to that loop
(``_loop.call``: no hop when the caller is on it already, as a ``SyncQueue`` is) and does what differs from a
broker's topic: there is no shared memory (tensor batches are copied into rows; ``zerocopy_mode="force"`` is
refused), no idempotency key is made for a put (nothing re-sends it), and reads need no long poll. Several
handles of one topic in one process share one ``engine.Topic`` (``open_topic``: a registry keyed by storage path
and name, on the engine loop); each handle gets its own ``EmbeddedTopic`` over it, and the last one to close
flushes and closes the engine's topic. The topic's files are locked against other processes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .. import engine
from ..errors import ConfigError
from ..tensors import batches, pieces
from . import _loop, big_batches, data_args
from .topic_api import Described, KeysAPI, KeysRead

if TYPE_CHECKING:
    from ..engine import BackendFactory, Location, Topic, TopicConfig
    from ..wire.codec import EncodedBatch
    from .remote_tensors import ArenaClient

METRIC_NAMES = ("puts", "records_put", "gets", "records_read", "flushes", "records_flushed", "flush_seconds")

_topics: dict[tuple[str, str], tuple[Topic, set[int]]] = {}
_registry_lock: asyncio.Lock | None = None


async def open_topic(
    name: str, location: Location, config: TopicConfig, factory: BackendFactory, holder: int, metrics: bool
) -> EmbeddedTopic:
    """The topic for ``holder`` (a handle's id), opened by the first holder in this process (replaying its log
    after a crash); ``ConfigError`` if it is open already with other bucket settings or durability."""
    topic = await _loop.call(_acquire(name, location, config, factory, holder))
    return EmbeddedTopic(topic, holder, metrics)


async def _acquire(name: str, location: Location, config: TopicConfig, factory: BackendFactory, holder: int) -> Topic:
    global _registry_lock
    if _registry_lock is None:
        _registry_lock = asyncio.Lock()
    async with _registry_lock:
        key = (str(location.local), name)  # the local root: one per object-store URI too
        entry = _topics.get(key)
        if entry is not None:
            topic, holders = entry
            for attr in ("num_buckets", "bucket_column", "durability"):
                if getattr(topic.config, attr) != getattr(config, attr):
                    raise ConfigError(
                        f"topic {name!r} is already open in this process with "
                        f"{attr}={getattr(topic.config, attr)!r}; this Queue asks for "
                        f"{attr}={getattr(config, attr)!r}"
                    )
            holders.add(holder)
            return topic
        # ``engine.X``: the topic and its storage load at the first embedded open (engine/__init__.py)
        remote = engine.object_store_topic(location, name, engine.topic_dirname(name))
        topic = engine.Topic(name, location.local, config, factory, remote=remote)
        try:
            await topic.open()
        except BaseException:
            await topic.close_quietly()
            raise
        _topics[key] = (topic, {holder})
        return topic


async def _release(topic: Topic, holder: int) -> None:
    key = (str(topic.path.parent), topic.name)
    entry = _topics.get(key)
    if entry is None:
        return
    entry[1].discard(holder)
    if not entry[1]:
        del _topics[key]
        await topic.close()


class EmbeddedTopic:
    """One handle's view of an engine ``Topic`` of this process; the ``TopicAPI`` contract (topic_api.py) says
    what each method does in this mode. Methods that only hand a coroutine to the engine loop return it without
    a coroutine of their own (a put or a read pays no extra layer)."""

    exclusive = True  # the topic's files are locked to this process
    arena: ArenaClient | None = None  # no shared memory in one process

    def __init__(self, topic: Topic, holder: int, metrics: bool = False) -> None:
        self.engine_topic = topic  # the engine's own (tests and maintenance reach it here)
        self.name = topic.name
        self.config = topic.config
        self.keys: KeysAPI = EmbeddedKeys(topic)
        self._holder = holder
        self._metrics = metrics

    @property
    def kinds(self) -> dict[str, str]:
        return self.engine_topic.kinds

    def count(self) -> int:
        return self.engine_topic.count()

    def current_count(self) -> int:
        return self.engine_topic.count()

    def new_put_key(self) -> str | None:
        return None

    def stored(self, first: int, count: int, kinds: dict[str, str]) -> tuple[int, int]:
        return first, count

    def aclose(self) -> Coroutine[Any, Any, None]:
        return _loop.call(_release(self.engine_topic, self._holder))

    def append(
        self,
        batch: EncodedBatch,
        partition: str,
        rows_blob: bytes,
        key: str | None = None,
        of: list[int] | None = None,
        dedup_bytes: tuple[int, int] | None = None,
        durable: bool = True,
    ) -> Coroutine[Any, Any, tuple[int, int]]:
        return _loop.call(self.engine_topic.append(batch, partition, rows_blob, key, of=of, durable=durable))

    def read_window(self, offset: int, limit: int) -> Coroutine[Any, Any, tuple[list[dict[str, Any]], Any, int]]:
        return _loop.call(self.engine_topic.read_window(offset, limit))

    def read_waiting(
        self, offset: int, limit: int, timeout: float | None
    ) -> Coroutine[Any, Any, tuple[list[dict[str, Any]], dict[str, str], int]]:
        return _loop.call(_read_waiting(self.engine_topic, offset, limit, timeout))

    def wait_beyond(self, index: int, timeout: float | None) -> Coroutine[Any, Any, bool]:
        return _loop.call(self.engine_topic.wait_beyond(index, timeout))

    def flush(self) -> Coroutine[Any, Any, None]:
        return _loop.call(self.engine_topic.flush())

    async def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = await _loop.call(self.engine_topic.stats())
        if self._metrics:
            m = self.engine_topic.metrics
            out["metrics"] = {name: getattr(m, name) for name in (*METRIC_NAMES, "commit_seconds")}
        return out

    async def refresh_kinds(self, fields: list[str] | None) -> None:
        return None  # the engine's kinds are always current

    async def take(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        sampler: Any,
        sampler_kw: dict[str, int],
        lease: float | None,
        fields: list[str] | None,
    ) -> Described:
        data_args.check_sampler(sampler)  # any object with sample() runs here (a broker runs the built-in ones)
        take = _take(self.engine_topic, partition, task, batch_size, timeout, sampler, sampler_kw, lease, fields)
        return await _loop.call(take)

    async def take_batch(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        fields: list[str],
        mode: str,
        device: Any,
        sampler: Any,
        sampler_kw: dict[str, int],
        lease: float | None,
    ) -> tuple[list[int], list[list[Any]], batches.Batch, int, int]:
        indexes, descs = await self.take(partition, task, batch_size, timeout, sampler, sampler_kw, lease, fields)
        if not indexes:
            return indexes, descs, batches.Batch(), 0, 0
        meta = batches.meta_from(indexes, partition, descs, fields)

        async def piece(part: Any) -> batches.Batch:
            return (await self.get_data(part.global_indexes, fields, mode, device, copy=False))[0]

        big = await big_batches.get(meta, fields, self, piece, device, mode)
        if big is not None:  # larger than one read of copies: from its spool files, or in pieces
            return indexes, descs, big, 0, sum(pieces.sample_bytes(meta, fields))
        data, zero, copied = await self.get_data(indexes, fields, mode, device)
        return indexes, descs, data, zero, copied

    def take_rows(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        sampler: Any,
        lease: float | None,
        fields: list[str],
        note: dict[str, Any] | None = None,
    ) -> Coroutine[Any, Any, tuple[list[tuple[int, dict[str, Any]]], range | None]]:
        return _loop.call(_take_rows(self.engine_topic, partition, task, batch_size, timeout, sampler, lease, fields))

    def describe(self, indexes: list[int]) -> Coroutine[Any, Any, list[list[Any]]]:
        return _loop.call(self.engine_topic.describe(indexes))

    async def get_data(
        self, indexes: list[int], fields: list[str], mode: str, device: Any, copy: bool = True, views_only: bool = False
    ) -> tuple[batches.Batch, int, int]:
        if views_only:
            return batches.Batch(), 0, 0  # nothing lies in shared memory here
        if mode == "force":
            raise ConfigError("zerocopy_mode='force' needs broker mode; embedded mode copies")
        dense, rows, kinds = await _loop.call(self.engine_topic.sample_columns(indexes, fields))
        data = await asyncio.to_thread(batches.from_columns, dense, rows, kinds, fields, device, copy)
        copied = sum(len(v) for r in rows for v in r.values() if isinstance(v, bytes))
        copied += sum(array.nbytes for _kind, _dtype, array in dense.values())
        return data, 0, copied

    async def mark_consumed(
        self, partition: str, task: str, indexes: list[int], then_put: tuple[str, EncodedBatch, bytes] | None = None
    ) -> range | None:
        await _loop.call(self.engine_topic.mark_consumed(partition, task, indexes))
        if then_put is None:
            return None
        put_partition, batch, blob = then_put
        first, n = await self.append(batch, put_partition, blob)
        return range(first, first + n)

    def give_back(self, partition: str, task: str, indexes: list[int]) -> Coroutine[Any, Any, None]:
        return _loop.call(_give_back(self.engine_topic, partition, task, indexes))

    def reset_consumption(self, partition: str, task: str) -> Coroutine[Any, Any, None]:
        return _loop.call(_reset(self.engine_topic, partition, task))

    async def consumed(self, partition: str, task: str) -> set[int] | None:
        state = self.engine_topic._takes._consumption.get((partition, task))
        return set() if state is None else set(state.done)

    def clear(self, partition: str, indexes: list[int] | None) -> Coroutine[Any, Any, int]:
        return _loop.call(self.engine_topic.clear(partition, indexes))

    def set_tags(self, partition: str, items: list[tuple[int, dict[str, Any]]]) -> Coroutine[Any, Any, None]:
        return _loop.call(self.engine_topic.set_tags(partition, items))

    def partitions(self) -> Coroutine[Any, Any, dict[str, dict[str, Any]]]:
        return _loop.call(self.engine_topic.partitions())

    async def spool_begin(self) -> tuple[str, str]:
        name, part = engine.new_spool_part(self.engine_topic.path, os.getpid())
        return name, str(part)

    def put_spooled(
        self,
        plain: EncodedBatch,
        partition: str,
        blob: bytes,
        key: str,
        name: str,
        fields: list[Any],
        of: list[int] | None,
    ) -> Coroutine[Any, Any, tuple[int, int]]:
        return _loop.call(engine.put_spooled(self.engine_topic, plain, partition, blob, key, name, fields, of))

    def spool_where(self, indexes: list[int], dense: list[str]) -> Coroutine[Any, Any, Any]:
        return _loop.call(engine.spool_where(self.engine_topic, indexes, dense))


class EmbeddedKeys:
    """The engine's key index (``engine/keys.py``) as a ``KeysAPI``, on the engine loop."""

    def __init__(self, topic: Topic) -> None:
        self._topic = topic

    async def put(
        self,
        partition: str,
        keys: list[str],
        tags: list[dict[str, Any]] | None,
        batch: EncodedBatch | None,
        blob: bytes | None,
        key: str | None,
    ) -> Described:
        topic = self._topic

        async def local() -> Described:
            _first, _count, indexes = await topic.keys.put(partition, keys, tags, batch, blob, key)
            return indexes, await topic.describe(indexes)

        return await _loop.call(local())

    async def get(self, partition: str, keys: list[str], fields: list[str] | None, mode: str, device: Any) -> KeysRead:
        topic = self._topic

        async def local() -> tuple[list[int | None], list[list[Any]], list[str], Any]:
            named = await topic.keys.lookup(partition, keys)
            found = [i for i in named if i is not None]
            runs = await topic.describe(found)
            shared = engine.shared_fields(runs)
            chosen = shared if fields is None else [f for f in fields if f in shared]
            rows = await topic.sample_rows(found, chosen) if found and chosen else None
            return named, runs, chosen, rows

        named, runs, chosen, rows = await _loop.call(local())
        data = None
        if rows is not None:
            data = await asyncio.to_thread(batches.from_rows, rows[0], rows[1], list(chosen), device)
        return named, runs, chosen, data, 0, 0

    def listing(self, partition: str | None) -> Coroutine[Any, Any, dict[str, dict[str, dict[str, Any]]]]:
        return _loop.call(self._topic.keys.listing(partition))

    def clear(self, partition: str, keys: list[str]) -> Coroutine[Any, Any, int]:
        return _loop.call(self._topic.keys.clear(partition, keys))

    def names(self, partition: str, indexes: list[int]) -> Coroutine[Any, Any, list[str | None]]:
        return _loop.call(self._topic.keys.names(partition, indexes))


async def _read_waiting(
    topic: Topic, offset: int, limit: int, timeout: float | None
) -> tuple[list[dict[str, Any]], dict[str, str], int]:
    while True:
        rows, kinds, end = await topic.read_window(offset, limit)
        if rows or end > offset:
            return rows, kinds, end
        if not await topic.wait_beyond(offset, timeout):
            return [], kinds, offset


async def _take(
    topic: Topic,
    partition: str,
    task: str,
    n: int,
    timeout: float | None,
    sampler: Any,
    kw: dict[str, Any],  # the sampler's dp_rank and batch_index
    lease: float | None,
    fields: list[str] | None,
) -> Described:
    held = None if lease is None else (lease, None)
    indexes = await topic.take(partition, task, n, timeout, sampler, held, fields=fields, **kw)
    return indexes, await topic.describe(indexes, lenient=True)


async def _take_rows(
    topic: Topic,
    partition: str,
    task: str,
    batch_size: int,
    timeout: float | None,
    sampler: Any,
    lease: float | None,
    fields: list[str],
) -> tuple[list[tuple[int, dict[str, Any]]], None]:
    held = None if lease is None else (lease, None)
    indexes = await topic.take(partition, task, batch_size, timeout, sampler, held)
    if not indexes:
        return [], None
    rows, _kinds = await topic.sample_rows(indexes, fields)
    return list(zip(indexes, rows, strict=True)), None


async def _reset(topic: Topic, partition: str, task: str) -> None:
    topic.reset_consumption(partition, task)


async def _give_back(topic: Topic, partition: str, task: str, indexes: list[int]) -> None:
    topic.give_back(partition, task, indexes)
