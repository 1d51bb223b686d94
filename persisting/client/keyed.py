"""Keyed samples (``Queue.kv_put``, ``kv_get``, ``kv_list``, ``kv_clear``, ``kv_names``): the client side of the
engine's key index (``engine/keys.py``, its contract). Each call is one engine call: embedded, a coroutine on the
engine loop; through a broker, one request (``broker/keys.py``), a keyed put's tensors through the arena as any
tensor put (``put_tensors`` with ``kv``), so a put of new keys stores their data, keys and tags in one round trip.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..engine import check_keys, shared_fields
from ..errors import ConfigError, InvalidRecordError, UnknownExtentError
from ..tensors import batches, dedup, objects, tensordicts
from ..tensors import column as tensors
from ..tensors.arena import peer_id
from ..tensors.meta import BatchMeta
from ..wire import codec
from . import _loop, dedup_reads, releases
from .data_api import on_topic
from .handle import TopicHandle
from .remote import RemoteTopic
from .remote_tensors import RESTART_RETRIES
from .tensor_puts import LEASE_TIMEOUT_S, TensorPuts, _storable

if TYPE_CHECKING:
    from ..engine import Topic

Described = tuple[list[int], list[list[Any]]]  # samples, Topic.describe's runs of them


def _partition(partition: Any) -> str:
    if not isinstance(partition, str) or not partition:
        raise ConfigError(f"partition_id must be a non-empty str, got {partition!r}")
    return partition


def _tags(tags: Any, n: int) -> list[dict[str, Any]] | None:
    if tags is None:
        return None
    if isinstance(tags, dict) or not isinstance(tags, list | tuple) or len(tags) != n:
        raise ConfigError(f"tags must be a list of one dict per key ({n}), got {tags!r:.100}")
    out = []
    for t in tags:
        if t is not None and not isinstance(t, dict):
            raise ConfigError(f"each tag must be a dict (or None), got {t!r:.100}")
        out.append(dict(t or {}))
    return out


async def put(
    handle: TopicHandle,
    puts: TensorPuts,
    keys: Any,
    data: Any,
    partition: Any,
    tags: Any,
    timeout: float | None,
    key: str | None,
) -> BatchMeta:
    """``Queue.kv_put``: see its docstring."""
    keys = check_keys(keys)
    partition = _partition(partition)
    given = _tags(tags, len(keys))
    topic = await handle.engine()
    described: Described
    if data is None:
        if given is None:
            raise ConfigError("kv_put needs data, tags or both")
        described = await _put_rows(topic, partition, keys, given, None, None, key)
        return batches.meta_from(described[0], partition, described[1], None)
    non_tensor: set[str] = set()
    if tensors.is_tensor_dict(data):
        data = tensordicts.flatten(data, non_tensor)
    columns, other, n = tensors.split(data)
    if n != len(keys):
        raise ConfigError(f"{len(keys)} keys need as many rows of data, got {n}")
    reserved = [name for name in (*columns, *other) if name.startswith(codec.RESERVED_PREFIX)]
    if reserved:
        raise InvalidRecordError(f"field {reserved[0]!r} starts with {codec.RESERVED_PREFIX!r} (reserved); rename it")
    other = objects.prepare(other, non_tensor, handle.objects, topic.kinds, _storable)

    async def store(
        columns: dict[str, tensors.AnyColumn], other: dict[str, list[Any]], dedup_bytes: tuple[int, int] | None
    ) -> BatchMeta:
        remote = await puts._through_arena(topic) if columns else None
        if remote is not None:
            plain = batches.other_rows(other, n, remote.kinds)
            try:
                wait = LEASE_TIMEOUT_S if timeout is None else timeout
                kv = {"keys": keys, "tags": given}
                blob = codec.pack(plain.rows)
                first, count, kinds, rest = await remote.arena.put_tensors(
                    columns, plain, blob, n, partition, wait, None, key, kv, dedup_bytes=dedup_bytes
                )
                remote.stored(first, count, kinds)
                handle.moved("put_zero_copy_bytes", sum(col.nbytes for col in columns.values()))
                return batches.meta_from(list(rest[0]), partition, list(rest[1]), None)
            except ConfigError as exc:
                if not puts._copy_instead(exc):
                    raise
        batch = await asyncio.to_thread(batches.full_rows, columns, other, n, topic.kinds)
        blob = await asyncio.to_thread(codec.pack, batch.rows)
        described = await _put_rows(topic, partition, keys, given, batch, blob, key)
        handle.moved("put_copied_bytes", sum(col.nbytes for col in columns.values()))
        return batches.meta_from(described[0], partition, described[1], None)

    # Deduped fields: their new distinct values stored first (payload rows), the keys' samples hold references;
    # stored again if a value this producer had stored was cleared meanwhile (TensorPuts.deduped).
    return await puts.deduped(topic, columns, other, partition, timeout, key, store)


async def _put_rows(
    topic: Topic | RemoteTopic,
    partition: str,
    keys: list[str],
    tags: list[dict[str, Any]] | None,
    batch: codec.EncodedBatch | None,
    blob: bytes | None,
    key: str | None,
) -> Described:
    if isinstance(topic, RemoteTopic):
        args = topic._args(partition=partition, keys=keys, tags=tags, key=key)
        if batch is not None and blob is not None:
            args.update(kinds=batch.kinds, count=len(batch.rows))
        reply = await topic._conn.request("kv_put", args, [blob] if blob is not None else [])
        first, count, indexes, runs = reply.result
        if batch is not None:
            topic.stored(int(first), int(count), dict(batch.kinds))
        return list(indexes), list(runs)

    async def local(engine: Topic) -> Described:
        _first, _count, indexes = await engine.keys.put(partition, keys, tags, batch, blob, key)
        return indexes, await engine.describe(indexes)

    return await _loop.call(local(topic))


async def get(
    handle: TopicHandle, keys: Any, partition: Any, fields: Any, device: Any, get_data: dedup_reads.GetData
) -> tuple[batches.Batch | None, BatchMeta]:
    """``Queue.kv_get``: (data or None, meta of the keys found); ``get_data`` reads deduped fields' payloads."""
    keys = check_keys(keys)
    partition = _partition(partition)
    if fields is not None and (isinstance(fields, str) or not all(isinstance(f, str) for f in fields)):
        raise ConfigError(f"fields must be a list of field names or None, got {fields!r:.100}")
    topic = await handle.engine()
    wanted = None if fields is None else await dedup_reads.named(topic, list(fields), handle.dedup)
    data: batches.Batch | None = None
    if isinstance(topic, RemoteTopic):
        mode = handle.zerocopy_mode
        for attempt in range(1, RESTART_RETRIES + 1):
            args = topic._args(
                partition=partition,
                keys=keys,
                fields=wanted,
                read=True,
                zerocopy=mode != "off",
                peer=_peer(),
                released=releases.take(topic.address),
            )
            reply = await topic._conn.request("kv_get", args)
            named, runs, chosen, result = reply.result
            if result is None:
                break
            try:
                data, zero, copied = await topic.arena.data(result, reply.buffers, list(chosen), mode, device)
            except UnknownExtentError:
                if attempt == RESTART_RETRIES:
                    raise
                continue  # views into the arena of a broker that restarted since (ArenaClient._arena): again
            handle.moved("get_zero_copy_bytes", zero)
            handle.moved("get_copied_bytes", copied)
            break
    else:

        async def local(engine: Topic) -> tuple[list[int | None], list[list[Any]], list[str], Any]:
            named = await engine.keys.lookup(partition, keys)
            found = [i for i in named if i is not None]
            runs = await engine.describe(found)
            shared = shared_fields(runs)
            chosen = shared if wanted is None else [f for f in wanted if f in shared]
            rows = await engine.sample_rows(found, chosen) if found and chosen else None
            return named, runs, chosen, rows

        named, runs, chosen, rows = await _loop.call(local(topic))
        if rows is not None:
            data = await asyncio.to_thread(batches.from_rows, rows[0], rows[1], list(chosen), device)
    if data is not None:  # deduped fields (``<name>@payload``) back to their values, named as put
        data = await dedup_reads.resolve(data, get_data, device)
        chosen = [c[: -len(dedup.REF_SUFFIX)] if c.endswith(dedup.REF_SUFFIX) else c for c in chosen]
    indexes = [int(i) for i in named if i is not None]
    meta = batches.meta_from(indexes, partition, list(runs), None)
    meta.extra_info["keys"] = [k for k, i in zip(keys, named, strict=True) if i is not None]
    meta.extra_info["missing"] = [k for k, i in zip(keys, named, strict=True) if i is None]
    meta.extra_info["fields"] = list(chosen)
    return data, meta


async def listing(handle: TopicHandle, partition: Any) -> dict[str, dict[str, dict[str, Any]]]:
    if partition is not None:
        partition = _partition(partition)
    topic = await handle.engine()
    if isinstance(topic, RemoteTopic):
        return dict((await topic._conn.request("kv_list", topic._args(partition=partition))).result)
    return await on_topic(topic, topic.keys.listing(partition))


async def clear(handle: TopicHandle, keys: Any, partition: Any) -> int:
    keys = check_keys(list(dict.fromkeys(keys)) if isinstance(keys, list | tuple) else keys)
    partition = _partition(partition)
    topic = await handle.engine()
    if isinstance(topic, RemoteTopic):
        return int((await topic._conn.request("kv_clear", topic._args(partition=partition, keys=keys))).result)
    return await on_topic(topic, topic.keys.clear(partition, keys))


async def names(handle: TopicHandle, indexes: Any, partition: Any) -> list[str | None]:
    partition = _partition(partition)
    if not isinstance(indexes, list | tuple) or not all(type(i) is int for i in indexes):
        raise ConfigError(f"global_indexes must be a list of int, got {indexes!r:.100}")
    topic = await handle.engine()
    if isinstance(topic, RemoteTopic):
        args = topic._args(partition=partition, indexes=list(indexes))
        return list((await topic._conn.request("kv_names", args)).result)
    return await on_topic(topic, topic.keys.names(partition, list(indexes)))


def _peer() -> Any:
    return peer_id()
