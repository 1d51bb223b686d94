"""A streaming data loader for trainers: a torch ``IterableDataset`` of (batch, meta) for one dp_rank.

    from persisting.client.loader import StreamingDataset
    ds = StreamingDataset("rollouts", ["input_ids", "logprobs"], batch_size=64, task_name="train",
                          partition_id="step-7", dp_rank=rank, broker="ipc:///run/persisting/broker.sock")
    for batch, meta in torch.utils.data.DataLoader(ds, batch_size=None):
        ...

Each iteration opens its own queue (so it works in DataLoader worker processes, started with spawn or
forkserver) and asks ``get_batch`` for batch_index 0, 1, 2, ... with ``RankAwareSampler`` by default: every
rank of one data-parallel group (same dp_rank) gets the identical batches, other dp_ranks disjoint ones.
It stops once ``timeout`` seconds pass with no batch (None: never). Requires torch (the ``torch`` extra).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch.utils.data

from ..engine.samplers import RankAwareSampler
from ..errors import ConfigError
from ..tensors.meta import BatchMeta
from .sync import SyncQueue


class StreamingDataset(torch.utils.data.IterableDataset[tuple[dict[str, Any], BatchMeta]]):
    def __init__(
        self,
        name: str,
        fields: Sequence[str],
        *,
        batch_size: int,
        task_name: str = "train",
        partition_id: str = "default",
        dp_rank: int = 0,
        sampler: Any = None,
        timeout: float | None = 30.0,
        device: Any = None,
        **queue_options: Any,
    ) -> None:
        if isinstance(fields, str) or not fields:
            raise ConfigError("fields must be a non-empty list of field names")
        self.name = name
        self.fields = list(fields)
        self.batch_size = batch_size
        self.task_name = task_name
        self.partition_id = partition_id
        self.dp_rank = dp_rank
        self.sampler = sampler if sampler is not None else RankAwareSampler()
        self.timeout = timeout
        self.device = device
        self.queue_options = queue_options

    def __iter__(self) -> Iterator[tuple[dict[str, Any], BatchMeta]]:
        with SyncQueue(self.name, **self.queue_options) as q:
            batch_index = 0
            while True:
                data, meta = q.get_batch(
                    self.fields,
                    self.batch_size,
                    self.task_name,
                    self.partition_id,
                    self.sampler,
                    self.device,
                    dp_rank=self.dp_rank,
                    batch_index=batch_index,
                    wait=True,
                    timeout=self.timeout,
                )
                if meta.size == 0:
                    return
                yield data, meta
                batch_index += 1
