"""``TransferQueueClient``: TransferQueue's low-level client calls that verl makes, over the same store.

Each ``async_*`` method runs its work on persisting's engine loop (``_engine.call``), so it can be awaited from
any event loop (verl awaits them from its own bridge loop thread and from Ray actors' loops); each sync twin is
made from it in one place (``_twin``) and blocks on that loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

from persisting import BatchMeta as PBatchMeta

from .. import _engine
from .metadata import BatchMeta
from .store import KVStore, _pmeta


def _as_list(value: Any) -> list[Any]:
    return [value] if isinstance(value, str) else list(value)


class TransferQueueClient:
    def __init__(self, store: KVStore, client_id: str = "persisting") -> None:
        self._store = store
        self.client_id = client_id

    def _run_coroutine(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return _engine.run(coro)

    async def async_get_data(self, metadata: BatchMeta) -> Any:
        """The fields ``metadata`` names, for its samples, as a TensorDict (TransferQueue's column rule)."""
        if metadata.size == 0:
            from tensordict import TensorDict

            return TensorDict({}, batch_size=(0,))
        parts = set(metadata.partition_ids)
        if len(parts) != 1:
            raise ValueError(f"get_data reads samples of one partition, this meta holds {sorted(parts)}")
        coro = self._store.get_data(metadata.partition_ids[0], list(metadata.global_indexes), metadata.field_names)
        return await _engine.call(coro)

    async def async_put(
        self, data: Any, metadata: BatchMeta | None = None, partition_id: str | None = None, **_: Any
    ) -> BatchMeta:
        return await _engine.call(self._store.put(data, metadata, partition_id))

    async def async_kv_retrieve_meta(self, keys: list[str] | str, partition_id: str, create: bool = False) -> BatchMeta:
        return await _engine.call(self._store.retrieve_meta(_as_list(keys), partition_id, create))

    async def async_kv_retrieve_keys(self, global_indexes: list[int], partition_id: str) -> list[str | None]:
        return await _engine.call(self._store.retrieve_keys(list(global_indexes), partition_id))

    async def async_kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, Any]]:
        return await _engine.call(self._store.kv_list(partition_id))

    async def async_set_custom_meta(self, metadata: BatchMeta) -> None:
        """Store the meta's tags with its samples (merged into what they have)."""
        by_part: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for i, p, t in zip(metadata.global_indexes, metadata.partition_ids, metadata.custom_meta, strict=True):
            by_part.setdefault(p, []).append((i, t))
        for p, items in by_part.items():
            meta = _pmeta(p, [i for i, _ in items], [t for _, t in items])
            await _engine.call(self._store.data.set_custom_meta(meta))

    async def async_clear_samples(self, metadata: BatchMeta) -> None:
        """Clear the samples (and the keys naming them)."""
        for p in dict.fromkeys(metadata.partition_ids):
            idx = [i for i, q in zip(metadata.global_indexes, metadata.partition_ids, strict=True) if q == p]
            keys = await self.async_kv_retrieve_keys(idx, p)
            named = [k for k in keys if k is not None]
            if named:
                await _engine.call(self._store.kv_clear(named, p))
            unnamed = [i for i, k in zip(idx, keys, strict=True) if k is None]
            if unnamed:
                await _engine.call(self._store.data.clear(unnamed, partition_id=p))

    async def async_clear_partition(self, partition_id: str) -> None:
        listed = (await self.async_kv_list(partition_id)).get(partition_id, {})
        if listed:
            await _engine.call(self._store.kv_clear(list(listed), partition_id))
        await _engine.call(self._store.data.clear(None, partition_id=partition_id))

    async def async_get_meta(
        self,
        data_fields: list[str],
        batch_size: int,
        partition_id: str,
        mode: str = "fetch",
        task_name: str | None = None,
        sampling_config: dict[str, Any] | None = None,
        **_: Any,
    ) -> BatchMeta:
        """The next ``batch_size`` samples of the partition whose ``data_fields`` are all written, consumed for
        ``task_name`` (persisting's consume-on-fetch, durable per task)."""
        if mode != "fetch" or task_name is None:
            raise NotImplementedError(
                f"get_meta(mode={mode!r}) is not covered by persisting's TransferQueue layer: use mode='fetch' with a "
                "task_name, or the KV calls"
            )
        kw = {k: v for k, v in (sampling_config or {}).items() if k in ("dp_rank", "batch_index")}
        coro = self._store.data.get_meta(list(data_fields), batch_size, task_name, partition_id, **kw)
        got: PBatchMeta = await _engine.call(coro)
        meta = await _engine.call(self._store._tq_meta(partition_id, got.global_indexes))
        return meta.select_fields(list(data_fields))

    async def async_reset_consumption(self, partition_id: str, task_name: str | None = None) -> None:
        if task_name is None:
            raise NotImplementedError("reset_consumption needs a task_name in persisting's TransferQueue layer")
        await _engine.call(self._store.data.reset_consumption(task_name, partition_id))

    def close(self) -> None:
        """Nothing to release here: the store is closed by ``transfer_queue.close()``."""


def _twin(name: str) -> Callable[..., Any]:
    method = getattr(TransferQueueClient, f"async_{name}")

    @functools.wraps(method)
    def call(self: TransferQueueClient, *args: Any, **kwargs: Any) -> Any:
        return _engine.run(method(self, *args, **kwargs))

    call.__name__ = name
    call.__doc__ = f"Blocking form of ``await client.async_{name}(...)``."
    return call


for _name in (
    "get_data",
    "put",
    "kv_retrieve_meta",
    "kv_retrieve_keys",
    "kv_list",
    "set_custom_meta",
    "clear_samples",
    "clear_partition",
    "get_meta",
    "reset_consumption",
):
    setattr(TransferQueueClient, _name, _twin(_name))
