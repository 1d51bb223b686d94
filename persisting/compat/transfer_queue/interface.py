"""TransferQueue's module-level API (``init``, ``close``, ``get_client``, the ``kv_*`` calls and their ``async_``
twins), with TransferQueue 0.1.11's arguments, return values and errors.

The sync twins are made from the async calls in one place (``_blocking``); both run on persisting's engine loop.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from .. import _engine
from . import config, node_broker
from .client import TransferQueueClient
from .metadata import KVBatchMeta
from .node_broker import Plane

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_plane: Plane | None = None
_client: TransferQueueClient | None = None


def init(conf: Any = None) -> Any:
    """Start the data plane (first call on the node) or attach to it (any later call, any process: ``conf`` is
    then ignored). Returns ``conf``."""
    global _plane, _client
    with _lock:
        if _plane is None:
            plane = connect(conf)
            if plane.owner and plane.section.get("fresh"):
                _engine.run(_clear_everything(plane))
            elif plane.owner:
                found = _engine.run(plane.store.kv_list(None))
                if any(found.values()):
                    logger.warning(
                        "persisting: this run resumes %s keys of partitions %s left on its storage by an earlier run "
                        "(a new experiment: conf persisting.fresh=true, or another persisting.storage_path)",
                        sum(len(v) for v in found.values()),
                        sorted(p for p, v in found.items() if v),
                    )
            _plane, _client = plane, TransferQueueClient(plane.store)
    return conf


async def _clear_everything(plane: Plane) -> None:
    listed = await plane.store.kv_list(None)
    for partition, keys in listed.items():
        await plane.store.kv_clear(list(keys), partition)


def close() -> None:
    """Let go of the data plane; the process that started the broker also stops it (after it flushed)."""
    global _plane, _client
    with _lock:
        plane, _plane, _client = _plane, None, None
    if plane is not None:
        plane.close()


def connect(conf: Any) -> Any:
    """The data plane ``init(conf)`` joins: the plane on several nodes of ``ray_plane.py`` where the ``backend``
    setting (or Ray running on several nodes) asks for it, else the node's broker (``node_broker.py``)."""
    section = config.read_section(conf)
    if not os.environ.get("PERSISTING_BROKER"):  # a named broker is the plane, whatever Ray runs
        from . import ray_plane  # Ray and persisting.ray only where they are used

        if ray_plane.wanted(section):
            return ray_plane.connect(section)
    return node_broker.attach(section)


def _store_client() -> TransferQueueClient:
    if _client is None:
        init()
    assert _client is not None  # set by init (an exception otherwise)
    return _client


def get_client() -> TransferQueueClient:
    if _client is None:
        raise AssertionError("Please initialize the TransferQueue first by calling `tq.init()`!")
    return _client


def get_metrics_endpoint() -> str | None:
    """The broker's Prometheus endpoint (``host:port``) if it was started with one, else None."""
    if _plane is None:
        init()
    return _plane.metrics_endpoint if _plane is not None else None


def _keys(keys: list[str] | str) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


def _fields(select_fields: list[str] | str | None) -> list[str] | None:
    return (
        [select_fields] if isinstance(select_fields, str) else (None if select_fields is None else list(select_fields))
    )


async def async_kv_put(
    key: str,
    partition_id: str,
    fields: Any = None,
    tag: dict[str, Any] | None = None,
    data_parser: Callable[[Any], Any] | None = None,
) -> KVBatchMeta:
    if fields is None and tag is None:
        raise ValueError("Please provide at least one parameter of fields or tag.")
    if data_parser is not None:
        raise NotImplementedError("data_parser is not supported by persisting's TransferQueue layer")
    if isinstance(fields, dict):
        import torch
        from tensordict import NonTensorStack, TensorDict

        batch: dict[str, Any] = {}
        for name, value in fields.items():
            if isinstance(value, torch.Tensor):
                if value.is_nested:
                    raise ValueError("Please use (async)kv_batch_put for batch operation")
                batch[name] = value.unsqueeze(0)
            else:
                batch[name] = NonTensorStack(value)
        fields = TensorDict(batch, batch_size=[1])
    elif fields is not None and not hasattr(fields, "batch_size"):
        raise ValueError("`fields` can only be dict or TensorDict")
    store = _store_client()._store
    return await _engine.call(store.kv_batch_put([key], partition_id, fields, None if tag is None else [tag]))


async def async_kv_batch_put(
    keys: list[str],
    partition_id: str,
    fields: Any = None,
    tags: list[dict[str, Any]] | None = None,
    data_parser: Callable[[Any], Any] | None = None,
) -> KVBatchMeta:
    if data_parser is not None:
        raise NotImplementedError("data_parser is not supported by persisting's TransferQueue layer")
    store = _store_client()._store
    return await _engine.call(store.kv_batch_put(_keys(keys), partition_id, fields, tags))


async def async_kv_batch_get(
    keys: list[str] | str, partition_id: str, select_fields: list[str] | str | None = None
) -> Any:
    store = _store_client()._store
    return await _engine.call(store.kv_batch_get(_keys(keys), partition_id, _fields(select_fields)))


async def async_kv_batch_get_by_meta(meta: KVBatchMeta, select_fields: list[str] | str | None = None) -> Any:
    if meta.partition_id is None:
        raise ValueError("Must provide partition_id in the input KVBatchMeta.")
    wanted = _fields(select_fields)
    if wanted is not None:
        if meta.fields is None or any(f not in meta.fields for f in wanted):
            raise ValueError(
                f"Some fields assigned in select_fields not found in the metadata. "
                f"Assigned: {wanted}; Fields in KVBatchMeta: {meta.fields}."
            )
    else:
        wanted = meta.fields
    return await async_kv_batch_get(meta.keys, meta.partition_id, wanted)


async def async_kv_list(partition_id: str | None = None) -> dict[str, dict[str, Any]]:
    store = _store_client()._store
    return await _engine.call(store.kv_list(partition_id))


async def async_kv_clear(keys: list[str] | str, partition_id: str) -> None:
    store = _store_client()._store
    await _engine.call(store.kv_clear(_keys(keys), partition_id))


def _blocking(coro_fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(coro_fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        _store_client()  # init() first (it blocks on the engine loop itself)
        return _engine.run(coro_fn(*args, **kwargs))

    call.__name__ = call.__qualname__ = coro_fn.__name__.removeprefix("async_")
    return call


kv_put = _blocking(async_kv_put)
kv_batch_put = _blocking(async_kv_batch_put)
kv_batch_get = _blocking(async_kv_batch_get)
kv_batch_get_by_meta = _blocking(async_kv_batch_get_by_meta)
kv_list = _blocking(async_kv_list)
kv_clear = _blocking(async_kv_clear)
