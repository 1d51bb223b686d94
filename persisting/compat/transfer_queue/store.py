"""The data plane behind the TransferQueue surface: TransferQueue's KV semantics over two persisting topics.

- ``<name>``: one sample (row, global index) per key of a partition; its columns are the key's fields, its tags
  the key's tag (``set_custom_meta``: merged with ``dict.update``, durable). A partial column write is a
  ``put(..., batch_meta=)`` of those fields only, so the other columns stay; reads give each field's latest value.
- ``<name>.keys``: the key log (``keys.KeyIndex``): which sample each key names. Clearing a key logs ``del`` and
  clears its sample; creating it again makes a new sample, so it starts with an empty tag (as TransferQueue).

Every method runs on persisting's engine loop (callers go through ``_engine.call``/``_engine.run``). Every call
returns after what it wrote is acknowledged by the broker (write-ahead log, ``durability``), so a kill -9 of any
process loses nothing a call returned for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

from persisting import BatchMeta as PBatchMeta
from persisting import Queue, SampleMeta

from . import columns
from .columns import KEY_FIELD
from .keys import KeyIndex
from .metadata import BatchMeta, KVBatchMeta

logger = logging.getLogger(__name__)


def _pmeta(partition: str, indexes: Sequence[int], tags: Sequence[dict[str, Any]] | None = None) -> PBatchMeta:
    tags = tags or [{} for _ in indexes]
    return PBatchMeta(tuple(SampleMeta(int(i), partition, {}, dict(t)) for i, t in zip(indexes, tags, strict=True)))


async def _nothing() -> None:
    return None


def _select_rows(td: Any, positions: list[int]) -> Any:
    if len(positions) == td.batch_size[0] and positions == list(range(len(positions))):
        return td
    import torch

    return td[torch.tensor(positions, dtype=torch.long)]


class KVStore:
    def __init__(self, data: Queue, log: Queue) -> None:
        self.data = data
        self.index = KeyIndex(log)

    async def aclose(self) -> None:
        await self.data.aclose()
        await self.index.log.aclose()

    # -- what is stored ------------------------------------------------------------------------------
    async def describe(
        self, partition: str, indexes: list[int], tags: Sequence[dict[str, Any]] | None = None
    ) -> PBatchMeta:
        """Every field written for each sample, with its stored tags (updated by ``tags`` in the answer only)."""
        if not indexes:
            return PBatchMeta()
        return await self.data.check_ready(_pmeta(partition, indexes, tags))

    @staticmethod
    def common_fields(described: PBatchMeta) -> list[str]:
        """The fields every sample has written, in the order the first sample lists them."""
        if not described.samples:
            return []
        first = [n for n, f in described.samples[0].fields.items() if f.is_ready and n != KEY_FIELD]
        return [
            n for n in first if all((f := s.fields.get(n)) is not None and f.is_ready for s in described.samples[1:])
        ]

    async def retrieve_meta(self, keys: list[str], partition: str, create: bool) -> BatchMeta:
        """TransferQueue's ``kv_retrieve_meta``: the keys' samples (missing keys left out, or created), with the
        fields all of them have and their tags."""
        await self.index.catch_up()
        if create:
            await self._create([k for k in dict.fromkeys(keys) if self.index.get(partition, k) is None], partition)
        found = [(k, i) for k in keys if (i := self.index.get(partition, k)) is not None]
        missing = [k for k in keys if self.index.get(partition, k) is None]
        if missing:
            logger.warning("Keys %s were not found in partition %s; they are left out", missing[:10], partition)
        return await self._tq_meta(partition, [i for _, i in found])

    async def _tq_meta(
        self, partition: str, indexes: list[int], tags: Sequence[dict[str, Any]] | None = None
    ) -> BatchMeta:
        """The keys' samples as TransferQueue's BatchMeta: the fields all of them have, their stored tags (merged
        with ``tags``, not stored by this)."""
        described = await self.describe(partition, indexes, tags)
        common = self.common_fields(described)
        schema: dict[str, dict[str, Any]] = {}
        if described.samples:
            for name in common:
                f = described.samples[0].fields[name]
                tensor = f.kind in ("tensor", "ndarray")
                schema[name] = {
                    "dtype": f.dtype or None,
                    "shape": f.shape,
                    "is_nested": False,
                    "is_non_tensor": not tensor,
                }
        return BatchMeta(
            list(indexes),
            [partition] * len(indexes),
            schema,
            [1 if common else 0] * len(indexes),
            {},
            [dict(s.custom_meta) for s in described.samples],
        )

    async def _create(
        self, keys: list[str], partition: str, fields: Any = None, tags: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """New samples for ``keys`` (with ``fields``' rows and ``tags`` if given), logged in the key log; the index
        each key names afterwards (another process's if it created the key first: then ours is cleared and the
        fields and tags are written to the winner's)."""
        if not keys:
            return []
        from tensordict import TensorDict

        base = fields if fields is not None else TensorDict({}, batch_size=[len(keys)])
        made = await self._put_new(columns.to_store(base, list(keys)), partition)
        # The tags go to our samples while the key log is appended (one round trip instead of two in a row).
        tagged = self.data.set_custom_meta(_pmeta(partition, made, tags)) if tags else _nothing()
        now, _ = await asyncio.gather(self.index.add(partition, keys, made), tagged)
        lost = [n for n, (mine, won) in enumerate(zip(made, now, strict=True)) if mine != won]
        if lost:
            await self.data.clear([made[n] for n in lost], partition_id=partition)
            if fields is not None:
                await self._write(partition, [now[n] for n in lost], _select_rows(fields, lost))
            if tags:
                await self.data.set_custom_meta(_pmeta(partition, [now[n] for n in lost], [tags[n] for n in lost]))
        return now

    async def _put_new(self, payload: Any, partition: str) -> list[int]:
        meta = await self.data.put(payload, partition_id=partition)
        if meta is None:  # a tensor batch put always returns its meta; a record put (not this) returns None
            raise RuntimeError("persisting returned no BatchMeta for a tensor batch put")
        return meta.global_indexes

    async def _write(self, partition: str, indexes: list[int], fields: Any) -> None:
        if fields is not None and len(list(fields.keys())) and indexes:
            await self.data.put(columns.to_store(fields), partition_id=partition, batch_meta=_pmeta(partition, indexes))

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
        seen = self._known(keys, partition)
        if seen:
            # Every key names a sample already (verl's tag updates and column writes): the writes, the description
            # of the answer and the key log's catch-up go at once (one round trip instead of two in a row). If the
            # catch-up shows another process cleared or re-created a key meanwhile, the call is made again below on
            # what the keys name now (the writes to the old samples went to cleared ones).
            writes = []
            if fields is not None:
                writes.append(self._write(partition, seen, fields))
            if tags is not None:
                writes.append(self.data.set_custom_meta(_pmeta(partition, seen, tags)))
            caught, wrote, answer = await asyncio.gather(
                self.index.catch_up(), asyncio.gather(*writes), self._tq_meta(partition, seen, tags),
                return_exceptions=True,
            )  # fmt: skip
            if isinstance(caught, BaseException):
                raise caught
            if self._known(keys, partition) == seen:
                for outcome in (wrote, answer):
                    if isinstance(outcome, BaseException):
                        raise outcome
                described = cast(BatchMeta, answer)
                written = sorted(fields.keys()) if fields is not None else []
                names = sorted(set(described.field_names) | set(written))
                return KVBatchMeta(list(keys), described.custom_meta, partition, names, {})
        await self.index.catch_up()
        known = [self.index.get(partition, k) for k in keys]
        new = [n for n, i in enumerate(known) if i is None]
        if new:
            sub = _select_rows(fields, new) if fields is not None else None
            new_tags = [tags[n] for n in new] if tags is not None else None
            for n, i in zip(new, await self._create([keys[n] for n in new], partition, sub, new_tags), strict=True):
                known[n] = i
        indexes = [int(i) for i in known if i is not None]
        is_new = set(new)
        old = [n for n in range(len(keys)) if n not in is_new]
        written = sorted(fields.keys()) if fields is not None else []
        writes = []
        if fields is not None and old:
            writes.append(self._write(partition, [indexes[n] for n in old], _select_rows(fields, old)))
        if tags is not None and old:  # the new keys' tags were written with them
            writes.append(
                self.data.set_custom_meta(_pmeta(partition, [indexes[n] for n in old], [tags[n] for n in old]))
            )
        if not old:  # every key new: what is stored is what was given (no round trip to describe it)
            await asyncio.gather(*writes)
            given = [dict(t) for t in tags] if tags is not None else [{} for _ in keys]
            return KVBatchMeta(list(keys), given, partition, written, {})
        # The answer (stored tags merged with these, the fields every key has) is described while the writes run:
        # check_ready merges the given tags into the stored ones, and the written fields are every key's now.
        _, meta = await asyncio.gather(asyncio.gather(*writes), self._tq_meta(partition, indexes, tags))
        names = sorted(set(meta.field_names) | set(written))
        return KVBatchMeta(list(keys), meta.custom_meta, partition, names, {})

    async def kv_batch_get(self, keys: list[str], partition: str, select_fields: list[str] | None) -> Any:
        known = self._known(keys, partition)
        if select_fields and known:
            # verl names the fields it reads and knows its keys: the key log is caught up, the keys described and
            # the fields read at once (one round trip instead of three in a row). The read counts only if the keys
            # still name the same samples and the description shows every key ready with every field; otherwise
            # it is dropped and the answer is TransferQueue's, from the description, as below.
            names = list(select_fields)
            outcomes: tuple[Any, ...] = await asyncio.gather(
                self.index.catch_up(),
                self._tq_meta(partition, known),
                self.get_data(partition, known, names),
                return_exceptions=True,
            )
            caught, ahead, read = outcomes
            if isinstance(caught, BaseException):
                raise caught
            if (
                self._known(keys, partition) == known
                and isinstance(ahead, BatchMeta)
                and ahead.is_ready
                and all(n in ahead.field_schema for n in names)
                and not isinstance(read, BaseException)
            ):
                return read
        meta = await self.retrieve_meta(keys, partition, create=False)
        if meta.size == 0:
            raise ValueError("keys or partition were not found!")
        if not meta.is_ready:
            raise ValueError("Some fields are not ready in all the requested keys!")
        names = list(meta.field_schema)
        if select_fields is not None:
            names = [f for f in select_fields if f in meta.field_schema]
            if not names:  # TransferQueue 0.1.11 then reads no field at all: an empty TensorDict
                from tensordict import TensorDict

                return TensorDict({}, batch_size=(0,))
        return await self.get_data(partition, meta.global_indexes, names)

    async def get_data(self, partition: str, indexes: list[int], names: list[str]) -> Any:
        if not indexes:
            from tensordict import TensorDict

            return TensorDict({}, batch_size=(0,))
        pmeta = _pmeta(partition, indexes)
        data = await self.data.get_data(_with_fields(pmeta, names))
        return columns.from_store(data, len(indexes), names)

    def _known(self, keys: list[str], partition: str) -> list[int]:
        """The samples ``keys`` name in this process's key map, or [] if one of them names none (yet)."""
        out = []
        for k in keys:
            i = self.index.get(partition, k)
            if i is None:
                return []
            out.append(i)
        return out

    async def kv_list(self, partition: str | None) -> dict[str, dict[str, Any]]:
        await self.index.catch_up()
        wanted = self.index.partitions() if partition is None else [partition]
        out: dict[str, dict[str, Any]] = {}
        for p in wanted:
            if p not in self.index.partitions():
                continue
            items = self.index.items(p)
            described = await self.describe(p, [i for _, i in items])
            out[p] = {k: dict(s.custom_meta) for (k, _), s in zip(items, described.samples, strict=True)}
        return out

    async def kv_clear(self, keys: list[str], partition: str) -> None:
        if isinstance(keys, str):
            keys = [keys]
        await self.index.catch_up()
        pairs = [(k, i) for k in dict.fromkeys(keys) if (i := self.index.get(partition, k)) is not None]
        if not pairs:
            return
        # The log first: a crash between the two leaves an unreachable sample, never a key naming a cleared one.
        await self.index.remove(partition, pairs)
        await self.data.clear([i for _, i in pairs], partition_id=partition)

    async def retrieve_keys(self, indexes: list[int], partition: str) -> list[str | None]:
        await self.index.catch_up()
        return [self.index.key_of(partition, int(i)) for i in indexes]

    async def put(self, data: Any, metadata: BatchMeta | None, partition: str | None) -> BatchMeta:
        """TransferQueueClient.put: fields of the samples ``metadata`` names (row k to its k-th sample), or new
        samples of ``partition`` without keys."""
        if metadata is not None and metadata.size:
            parts = set(metadata.partition_ids)
            if len(parts) != 1:
                raise ValueError(f"a put writes samples of one partition, this meta holds {sorted(parts)}")
            if data.batch_size[0] != metadata.size:
                raise ValueError(f"data has {data.batch_size[0]} rows, the meta {metadata.size} samples")
            await self._write(metadata.partition_ids[0], metadata.global_indexes, data)
            out = metadata.copy()
            out.add_fields(data)
            return out
        if not partition:
            raise ValueError("put needs metadata or a partition_id")
        made = await self._put_new(columns.to_store(data), partition)
        meta = BatchMeta(list(made), [partition] * len(made))
        return meta.add_fields(data)


def _with_fields(pmeta: PBatchMeta, names: list[str]) -> PBatchMeta:
    """A meta naming ``names`` for every sample (what ``get_data`` reads)."""
    from persisting import FieldMeta

    fields = {n: FieldMeta(n, "") for n in names}
    return PBatchMeta(
        tuple(SampleMeta(s.global_index, s.partition_id, fields, {}) for s in pmeta.samples), {"fields": list(names)}
    )
