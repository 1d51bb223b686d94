"""The data plane behind the TransferQueue surface: TransferQueue's KV semantics over one persisting topic.

``<name>``: one sample (row, global index) per key of a partition; its columns are the key's fields, its tags
the key's tag (merged with ``dict.update``, durable). Which sample a key names is the engine's key index
(``Queue.kv_put``/``kv_get``/``kv_list``/``kv_clear``, contract in ``persisting/engine/keys.py``): kept where the
engine runs (the broker), durable in the samples' own rows, found again after a restart without a checkpoint.
So each KV call here is one engine call (one broker round trip): no process keeps or replays a key map. A partial
column write is a patch of the keys' samples (the other columns stay; reads give each field's latest value);
clearing a key clears its sample, and creating it again makes a new sample with an empty tag (as TransferQueue).

Every method runs on persisting's engine loop (callers go through ``_engine.call``/``_engine.run``) and returns
after what it wrote is acknowledged by the broker (write-ahead log, ``durability``), so a kill -9 of any process
loses nothing a call returned for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from persisting import BatchMeta as PBatchMeta
from persisting import FieldMeta, Queue, SampleMeta
from persisting.tensors.dedup import REF_SUFFIX

from . import columns
from .metadata import BatchMeta, KVBatchMeta

logger = logging.getLogger(__name__)


def as_put(described: PBatchMeta) -> PBatchMeta:
    """``described`` with each deduped field under the name it was put with: its samples hold ``<name>@payload``
    (the row of its one stored copy, tensors/dedup.py), which is no business of TransferQueue's callers."""
    if not any(n.endswith(REF_SUFFIX) for s in described.samples for n in s.fields):
        return described
    renamed: dict[int, dict[str, FieldMeta]] = {}  # the samples of one run share one mapping: renamed once
    samples = []
    for s in described.samples:
        fields = renamed.get(id(s.fields))
        if fields is None:
            fields = renamed[id(s.fields)] = {
                (base := n.removesuffix(REF_SUFFIX)): FieldMeta(base, f.kind, f.dtype, f.shape, f.production_status)
                for n, f in s.fields.items()
            }
        samples.append(SampleMeta(s.global_index, s.partition_id, fields, s.custom_meta))
    return PBatchMeta(tuple(samples), dict(described.extra_info))


def _pmeta(partition: str, indexes: Sequence[int], tags: Sequence[dict[str, Any]] | None = None) -> PBatchMeta:
    tags = tags or [{} for _ in indexes]
    return PBatchMeta(tuple(SampleMeta(int(i), partition, {}, dict(t)) for i, t in zip(indexes, tags, strict=True)))


def common_fields(described: PBatchMeta) -> list[str]:
    """The fields every sample has written, in the order the first sample lists them."""
    if not described.samples:
        return []
    first = [n for n, f in described.samples[0].fields.items() if f.is_ready]
    return [n for n in first if all((f := s.fields.get(n)) is not None and f.is_ready for s in described.samples[1:])]


def tq_meta(partition: str, described: PBatchMeta) -> BatchMeta:
    """Described samples as TransferQueue's BatchMeta: the fields all of them have, their tags."""
    common = common_fields(described)
    schema: dict[str, dict[str, Any]] = {}
    for name in common:
        f = described.samples[0].fields[name]
        tensor = f.kind in ("tensor", "ndarray", "jagged")
        schema[name] = {"dtype": f.dtype or None, "shape": f.shape, "is_nested": False, "is_non_tensor": not tensor}
    n = described.size
    return BatchMeta(
        list(described.global_indexes),
        [partition] * n,
        schema,
        [1 if common else 0] * n,
        {},
        [dict(s.custom_meta) for s in described.samples],
    )


class KVStore:
    def __init__(self, data: Queue, dedup: Any = False) -> None:
        self.data = data
        self.dedup = dedup  # the data Queue's ``dedup`` (config.dedup_mode): a checkpoint of it stores alike

    async def aclose(self) -> None:
        await self.data.aclose()

    # -- what is stored ------------------------------------------------------------------------------
    async def describe(
        self, partition: str, indexes: list[int], tags: Sequence[dict[str, Any]] | None = None
    ) -> PBatchMeta:
        """Every field written for each sample, with its stored tags (updated by ``tags`` in the answer only)."""
        if not indexes:
            return PBatchMeta()
        return as_put(await self.data.check_ready(_pmeta(partition, indexes, tags)))

    async def _tq_meta(self, partition: str, indexes: list[int]) -> BatchMeta:
        return tq_meta(partition, await self.describe(partition, indexes))

    async def lookup(self, keys: list[str], partition: str) -> tuple[PBatchMeta, list[str]]:
        """The keys' samples, described (keys naming none left out), and the keys found."""
        _, meta = await self.data.kv_get(keys, partition, fields=[])
        return as_put(meta), list(meta.extra_info["keys"])

    async def retrieve_meta(self, keys: list[str], partition: str, create: bool) -> BatchMeta:
        """TransferQueue's ``kv_retrieve_meta``: the keys' samples (missing keys left out, or created), with the
        fields all of them have and their tags."""
        unique = list(dict.fromkeys(keys))
        if create and unique:
            described = as_put(await self.data.kv_put(unique, None, partition, tags=[{} for _ in unique]))
            by_key = dict(zip(unique, described.samples, strict=True))
            return tq_meta(partition, PBatchMeta(tuple(by_key[k] for k in keys)))
        meta, found = await self.lookup(keys, partition)
        if len(found) < len(keys):
            missing = [k for k in keys if k not in set(found)]
            logger.warning("Keys %s were not found in partition %s; they are left out", missing[:10], partition)
        return tq_meta(partition, meta)

    # -- TransferQueue's KV calls ---------------------------------------------------------------------
    async def kv_batch_put(
        self, keys: list[str], partition: str, fields: Any = None, tags: list[dict[str, Any]] | None = None
    ) -> KVBatchMeta:
        if fields is None and tags is None:
            raise ValueError("Please provide at least one parameter of `fields` or `tags`.")
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"keys must be a list of str, got {keys!r}"[:200])
        if len(set(keys)) != len(keys):
            raise ValueError("a key appears twice in one kv_batch_put")
        if fields is not None and fields.batch_size[0] != len(keys):
            raise ValueError(
                f"`keys` with length {len(keys)} does not match the `fields` TensorDict with "
                f"batch_size {fields.batch_size[0]}"
            )
        if tags is not None and len(tags) != len(keys):
            raise ValueError(f"keys with length {len(keys)} does not match length of tags {len(tags)}")
        written = sorted(fields.keys()) if fields is not None else []
        payload = columns.to_store(fields) if written else None
        given = list(tags) if tags is not None else (None if payload is not None else [{} for _ in keys])
        # One call: new keys get samples (data, key and tags together), known ones a patch and merged tags.
        described = as_put(await self.data.kv_put(list(keys), payload, partition, tags=given))
        names = sorted(set(common_fields(described)) | set(written))
        return KVBatchMeta(list(keys), [dict(s.custom_meta) for s in described.samples], partition, names, {})

    async def kv_batch_get(self, keys: list[str], partition: str, select_fields: list[str] | None) -> Any:
        # One call: the keys' samples, described, and the fields they all have (or those of select_fields).
        data, meta = await self.data.kv_get(list(keys), partition, fields=select_fields)
        meta = as_put(meta)
        if meta.size == 0:
            raise ValueError("keys or partition were not found!")
        missing = meta.extra_info["missing"]
        if missing:
            logger.warning("Keys %s were not found in partition %s; they are left out", missing[:10], partition)
        common = common_fields(meta)
        if not common:
            raise ValueError("Some fields are not ready in all the requested keys!")
        names = list(meta.extra_info["fields"])
        if not names:  # select_fields names none of them: TransferQueue 0.1.11 then reads nothing
            from tensordict import TensorDict

            return TensorDict({}, batch_size=(0,))
        return columns.from_store(data, meta.size, names)

    async def kv_list(self, partition: str | None) -> dict[str, dict[str, Any]]:
        return await self.data.kv_list(partition)

    async def kv_clear(self, keys: list[str], partition: str) -> None:
        if isinstance(keys, str):
            keys = [keys]
        await self.data.kv_clear(list(dict.fromkeys(keys)), partition)

    async def retrieve_keys(self, indexes: list[int], partition: str) -> list[str | None]:
        return await self.data.kv_names([int(i) for i in indexes], partition)

    async def get_data(self, partition: str, indexes: list[int], names: list[str]) -> Any:
        if not indexes:
            from tensordict import TensorDict

            return TensorDict({}, batch_size=(0,))
        pmeta = _pmeta(partition, indexes)
        data = await self.data.get_data(_with_fields(pmeta, names))
        return columns.from_store(data, len(indexes), names)

    async def put(self, data: Any, metadata: BatchMeta | None, partition: str | None) -> BatchMeta:
        """TransferQueueClient.put: fields of the samples ``metadata`` names (row k to its k-th sample), or new
        samples of ``partition`` without keys."""
        if metadata is not None and metadata.size:
            parts = set(metadata.partition_ids)
            if len(parts) != 1:
                raise ValueError(f"a put writes samples of one partition, this meta holds {sorted(parts)}")
            if data.batch_size[0] != metadata.size:
                raise ValueError(f"data has {data.batch_size[0]} rows, the meta {metadata.size} samples")
            if len(list(data.keys())):
                pmeta = _pmeta(metadata.partition_ids[0], metadata.global_indexes)
                await self.data.put(columns.to_store(data), partition_id=pmeta.partition_ids[0], batch_meta=pmeta)
            out = metadata.copy()
            out.add_fields(data)
            return out
        if not partition:
            raise ValueError("put needs metadata or a partition_id")
        put = await self.data.put(columns.to_store(data), partition_id=partition)
        made = put.global_indexes if put is not None else []
        meta = BatchMeta(list(made), [partition] * len(made))
        return meta.add_fields(data)


def _with_fields(pmeta: PBatchMeta, names: list[str]) -> PBatchMeta:
    """A meta naming ``names`` for every sample (what ``get_data`` reads)."""
    fields = {n: FieldMeta(n, "") for n in names}
    return PBatchMeta(
        tuple(SampleMeta(s.global_index, s.partition_id, fields, {}) for s in pmeta.samples), {"fields": list(names)}
    )
