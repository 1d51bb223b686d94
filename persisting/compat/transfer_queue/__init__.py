"""TransferQueue 0.1.11's API on persisting: ``import persisting.compat.transfer_queue as tq``, or, once enabled
(``persisting-transfer-queue enable``), ``import transfer_queue as tq`` in every process of the environment.

Every name verl 0.9.1 imports from ``transfer_queue`` exists here (if one were missing, verl would silently
replace the whole module by mocks). The data plane is one ``persisting-broker`` per node, durable: see
``node_broker.py`` (``ray_plane.py`` on several nodes) and the docs page "Using persisting as verl's data plane".
"""

from pathlib import Path
from typing import Any

from . import checkpoint, interface
from .client import TransferQueueClient
from .interface import (
    async_kv_batch_get,
    async_kv_batch_get_by_meta,
    async_kv_batch_put,
    async_kv_clear,
    async_kv_list,
    async_kv_put,
    close,
    get_client,
    get_metrics_endpoint,
    init,
    kv_batch_get,
    kv_batch_get_by_meta,
    kv_batch_put,
    kv_clear,
    kv_list,
    kv_put,
)
from .metadata import BatchMeta, KVBatchMeta
from .samplers import BaseSampler, GRPOGroupNSampler, RankAwareSampler, SeqlenBalancedSampler, SequentialSampler

__version__ = "0.1.11"  # the TransferQueue API this layer follows (verl checks it for checkpoint support)
BACKEND = "persisting"  # tells this layer apart from TransferQueue itself


class StorageKeyNotFoundError(KeyError):
    """TransferQueue's error for a storage key that does not exist (exported for code that catches it)."""


def save_checkpoint(
    checkpoint_dir: str | Path, *, include_storage: bool = True, metadata: dict[str, Any] | None = None
) -> None:
    """Save every key (fields and tags) to ``checkpoint_dir`` atomically, with TransferQueue's metadata.json."""
    if interface._plane is None:
        raise RuntimeError("TransferQueue is not initialized. Call tq.init() first.")
    checkpoint.save_checkpoint(interface._plane.store, checkpoint_dir, include_storage, metadata)


def load_checkpoint(checkpoint_dir: str | Path) -> None:
    """Replace every key by those of the checkpoint (keys made since are cleared)."""
    if interface._plane is None:
        raise RuntimeError("TransferQueue is not initialized. Call tq.init() first.")
    checkpoint.load_checkpoint(interface._plane.store, checkpoint_dir)


def __getattr__(name: str) -> Any:
    if name in ("StreamingDataLoader", "StreamingDataset"):
        raise AttributeError(
            f"transfer_queue.{name} is not covered by persisting's TransferQueue layer; use "
            "persisting.loader.StreamingDataset, or the KV calls"
        )
    raise AttributeError(f"module 'transfer_queue' (persisting's layer) has no attribute {name!r}")


__all__ = [
    "BaseSampler",
    "BatchMeta",
    "GRPOGroupNSampler",
    "KVBatchMeta",
    "RankAwareSampler",
    "SeqlenBalancedSampler",
    "SequentialSampler",
    "StorageKeyNotFoundError",
    "TransferQueueClient",
    "async_kv_batch_get",
    "async_kv_batch_get_by_meta",
    "async_kv_batch_put",
    "async_kv_clear",
    "async_kv_list",
    "async_kv_put",
    "close",
    "get_client",
    "get_metrics_endpoint",
    "init",
    "kv_batch_get",
    "kv_batch_get_by_meta",
    "kv_batch_put",
    "kv_clear",
    "kv_list",
    "kv_put",
    "load_checkpoint",
    "save_checkpoint",
]
