"""Keyed samples (``Queue.kv_put``, ``kv_get``, ``kv_list``, ``kv_clear``, ``kv_names``): the client side of the
engine's key index (``engine/keys.py``, its contract). Arguments are checked here; then each call is one call of
the topic's ``keys`` (``topic_api.KeysAPI``: embedded, a coroutine on the engine loop; through a broker, one
request), a keyed put's tensors through the arena where the topic has one, as any tensor put (``put_tensors``
with ``kv``), so a put of new keys stores their data, keys and tags in one round trip.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..engine import check_keys
from ..errors import ConfigError
from ..tensors import batches, dedup, objects, tensordicts
from ..tensors import column as tensors
from ..tensors.meta import BatchMeta
from ..wire import codec
from . import dedup_reads
from .handle import TopicHandle
from .tensor_puts import LEASE_TIMEOUT_S, TensorPuts, _storable
from .topic_api import Described


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
    partition = codec.check_partition(_partition(partition))
    given = _tags(tags, len(keys))
    topic = await handle.engine()
    described: Described
    if data is None:
        if given is None:
            raise ConfigError("kv_put needs data, tags or both")
        described = await topic.keys.put(partition, keys, given, None, None, key)
        return batches.meta_from(described[0], partition, described[1], None)
    non_tensor: set[str] = set()
    if tensors.is_tensor_dict(data):
        data = tensordicts.flatten(data, non_tensor)
    columns, other, n = tensors.split(data)
    if n != len(keys):
        raise ConfigError(f"{len(keys)} keys need as many rows of data, got {n}")
    codec.check_names("field", (*columns, *other))
    other = objects.prepare(other, non_tensor, handle.objects, topic.kinds, _storable)

    async def store(
        columns: dict[str, tensors.AnyColumn], other: dict[str, list[Any]], dedup_bytes: tuple[int, int] | None
    ) -> BatchMeta:
        arena = await puts._through_arena(topic) if columns else None
        if arena is not None:
            plain = batches.other_rows(other, n, topic.kinds)
            try:
                wait = LEASE_TIMEOUT_S if timeout is None else timeout
                kv = {"keys": keys, "tags": given}
                blob = codec.pack(plain.rows)
                first, count, kinds, rest = await arena.put_tensors(
                    columns, plain, blob, n, partition, wait, None, key, kv, dedup_bytes=dedup_bytes
                )
                topic.stored(first, count, kinds)
                handle.moved("put_zero_copy_bytes", sum(col.nbytes for col in columns.values()))
                return batches.meta_from(list(rest[0]), partition, list(rest[1]), None)
            except ConfigError as exc:
                if not puts._copy_instead(exc):
                    raise
        batch = await asyncio.to_thread(batches.full_rows, columns, other, n, topic.kinds)
        blob = await asyncio.to_thread(codec.pack, batch.rows)
        described = await topic.keys.put(partition, keys, given, batch, blob, key)
        handle.moved("put_copied_bytes", sum(col.nbytes for col in columns.values()))
        return batches.meta_from(described[0], partition, described[1], None)

    # Deduped fields: their new distinct values stored first (payload rows), the keys' samples hold references;
    # stored again if a value this producer had stored was cleared meanwhile (TensorPuts.deduped).
    return await puts.deduped(topic, columns, other, partition, timeout, key, store)


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
    mode = handle.zerocopy_mode
    named, runs, chosen, data, zero, copied = await topic.keys.get(partition, keys, wanted, mode, device)
    handle.moved("get_zero_copy_bytes", zero)
    handle.moved("get_copied_bytes", copied)
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
    return await topic.keys.listing(partition)


async def clear(handle: TopicHandle, keys: Any, partition: Any) -> int:
    keys = check_keys(list(dict.fromkeys(keys)) if isinstance(keys, list | tuple) else keys)
    partition = _partition(partition)
    topic = await handle.engine()
    return await topic.keys.clear(partition, keys)


async def names(handle: TopicHandle, indexes: Any, partition: Any) -> list[str | None]:
    partition = _partition(partition)
    if not isinstance(indexes, list | tuple) or not all(type(i) is int for i in indexes):
        raise ConfigError(f"global_indexes must be a list of int, got {indexes!r:.100}")
    topic = await handle.engine()
    return await topic.keys.names(partition, list(indexes))
