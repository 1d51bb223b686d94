"""The TransferQueue-style data API of ``Queue``: samples handed to tasks and what goes with them.

The base of ``queue.Queue``, holding only the topic's ``handle.TopicHandle`` (the one owner of the state it uses):
``get_meta`` (take samples for a task, with a sampler, readiness of fields, waiting,
consume-on-fetch or leases), ``get_data`` and ``get_batch`` (their fields: views on shared memory in broker mode),
``check_ready``, ``mark_consumed``, ``reset_consumption``, ``clear``, ``set_custom_meta`` (tags) and
``partitions``. Arguments are checked here, in the caller's thread, so that bad input is refused before it reaches
an engine or the wire; then each call is one or two calls of the topic (``topic_api.TopicAPI``), the same in
either mode (embedded they run on the engine loop; through a broker each is one request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..errors import ConfigError
from ..tensors import batches, objects, tensordicts
from ..tensors.meta import BatchMeta
from . import big_batches, data_args, dedup_reads
from .handle import TopicHandle

DEFAULT_LEASE_SECONDS = 60.0  # acknowledged delivery: how long a consumer has to mark_consumed


class DataAPI:
    def __init__(self, handle: TopicHandle) -> None:
        self._handle = handle

    async def get_meta(
        self,
        fields: Sequence[str] | None = None,
        batch_size: int = 1,
        task_name: str = "default",
        partition_id: str = "default",
        sampler: Any = None,
        *,
        dp_rank: int | None = None,
        batch_index: int | None = None,
        wait: bool = False,
        timeout: float | None = None,
        delivery: str = "fetch",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> BatchMeta:
        """Hand the next ``batch_size`` samples of ``partition_id`` to ``task_name`` (each sample goes to a task
        once: consume-on-fetch). Fewer, or none, when fewer are there yet; the meta names them for get_data.

        ``wait=True``: first wait (notified by puts, not polling) until ``batch_size`` samples are there, at
        most ``timeout`` seconds (None: for ever); then hand out what there is, which may be fewer or none.

        ``delivery="ack"``: acknowledged delivery. The samples are leased for ``lease_seconds``; ``mark_consumed``
        acknowledges them; a lease that ends first, or whose process died, gives them back to the task
        (at-least-once). The default ``"fetch"`` hands each sample to the task once (consume-on-fetch).

        ``sampler``: which ready samples to hand out (``persisting.samplers``: SequentialSampler, the default;
        RankAwareSampler with ``dp_rank`` and ``batch_index``; GRPOGroupNSampler; or your own in embedded mode).

        ``fields``: only samples whose every one of these fields is produced (written by their put or by a later
        ``put(..., batch_meta=...)``) are handed out; the others wait for their fields (``wait=True`` is woken by
        the put that completes them). None: every sample, with the fields it has."""
        self._check_take_args(batch_size, task_name, partition_id, timeout)
        topic = await self._handle.engine()
        wanted = await dedup_reads.named(topic, data_args.field_list(fields, "get_meta"), self._handle.dedup)
        limit = (None if timeout is None else float(timeout)) if wait else 0.0
        kw = data_args.sampler_kw(dp_rank, batch_index)
        lease = data_args.lease_of(delivery, lease_seconds)
        indexes, descs = await topic.take(partition_id, task_name, batch_size, limit, sampler, kw, lease, wanted)
        return batches.meta_from(indexes, partition_id, descs, wanted)

    async def check_ready(self, batch_meta: BatchMeta, fields: Sequence[str] | None = None) -> BatchMeta:
        """The same samples with each field's current production status (``FieldMeta.production_status``,
        ``SampleMeta.is_ready``, ``BatchMeta.is_ready``): for ``fields``, or the fields the meta names. Takes
        nothing; partitions stay as they are, tags are the stored ones updated by the meta's own. A meta naming no
        field (built from global indexes) is described with every field written for its samples."""
        if not isinstance(batch_meta, BatchMeta):
            raise ConfigError(f"check_ready takes a BatchMeta, got {type(batch_meta).__qualname__}")
        given = data_args.field_list(fields, "check_ready")
        wanted: list[str] | None = given if given is not None else batches.wanted_fields(batch_meta)
        if not wanted and fields is None:
            wanted = None  # a meta naming no field: describe every field written for its samples
        indexes = batch_meta.global_indexes
        if not indexes:
            return batch_meta
        topic = await self._handle.engine()
        descs = await topic.describe(indexes)
        fresh = batches.meta_from(indexes, "", descs, wanted)
        samples = tuple(
            replace(new, partition_id=old.partition_id, custom_meta={**new.custom_meta, **old.custom_meta})
            for new, old in zip(fresh.samples, batch_meta.samples, strict=True)
        )
        return BatchMeta(samples, {**batch_meta.extra_info, "fields": wanted})

    async def mark_consumed(
        self, task_name: str, global_indexes: Sequence[int] | BatchMeta, partition_id: str = "default"
    ) -> None:
        """Acknowledge samples taken with ``delivery="ack"`` (or any samples): never handed to the task again."""
        self._check_take_args(0, task_name, partition_id, None)
        indexes = global_indexes.global_indexes if isinstance(global_indexes, BatchMeta) else list(global_indexes)
        if not all(type(i) is int and i >= 0 for i in indexes):
            raise ConfigError("global_indexes must be ints >= 0 (or a BatchMeta)")
        topic = await self._handle.engine()
        await topic.mark_consumed(partition_id, task_name, indexes)

    async def give_back(
        self, task_name: str, global_indexes: Sequence[int] | BatchMeta, partition_id: str = "default"
    ) -> None:
        """Negative acknowledgement of samples taken with ``delivery="ack"``: their leases end now and the samples
        are ready for the task again (a waiting ``get_meta`` is woken). Samples not leased are left as they are."""
        self._check_take_args(0, task_name, partition_id, None)
        indexes = global_indexes.global_indexes if isinstance(global_indexes, BatchMeta) else list(global_indexes)
        if not all(type(i) is int and i >= 0 for i in indexes):
            raise ConfigError("global_indexes must be ints >= 0 (or a BatchMeta)")
        topic = await self._handle.engine()
        await topic.give_back(partition_id, task_name, indexes)

    async def reset_consumption(self, task_name: str, partition_id: str = "default") -> None:
        """Make every sample of ``partition_id`` available to ``task_name`` again (survives a restart)."""
        self._check_take_args(0, task_name, partition_id, None)
        topic = await self._handle.engine()
        await topic.reset_consumption(partition_id, task_name)

    async def clear(
        self, global_indexes: Sequence[int] | BatchMeta | None = None, partition_id: str = "default"
    ) -> int:
        """Delete samples of ``partition_id`` (None: all of them); returns how many were newly cleared.

        Durable (logged, and synced with ``durability="sync"``) before it returns. Cleared samples are never
        handed out again, ``get_data`` of them raises ``ConfigError``, ``get()``/``stream()`` skip them, and no
        other sample's global index changes. Their rows leave the Lance datasets while the topic runs (a purge at
        most every ``PERSISTING_PURGE_SPACING`` seconds, 30 by default) and at its next open."""
        self._check_take_args(0, "clear", partition_id, None)
        indexes = None
        if global_indexes is not None:
            indexes = global_indexes.global_indexes if isinstance(global_indexes, BatchMeta) else list(global_indexes)
            if not all(type(i) is int and i >= 0 for i in indexes):
                raise ConfigError("global_indexes must be ints >= 0 (or a BatchMeta, or None for the whole partition)")
        topic = await self._handle.engine()
        return await topic.clear(partition_id, indexes)

    async def set_custom_meta(self, batch_meta: BatchMeta) -> None:
        """Store the samples' tags (``custom_meta``, set with ``BatchMeta.with_custom_meta``) with the samples.

        Merged into what each sample has (a key set again takes the new value); durable when this returns (synced
        with ``durability="sync"``); every later ``get_meta``, ``get_batch`` and ``check_ready``, in any process and
        after a restart, hands the samples out with them. Values must be msgpack-safe."""
        if not isinstance(batch_meta, BatchMeta):
            raise ConfigError(f"set_custom_meta takes a BatchMeta, got {type(batch_meta).__qualname__}")
        by_partition: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for sample in batch_meta.samples:
            data_args.check_tags(sample.global_index, sample.custom_meta)
            if sample.custom_meta:
                by_partition.setdefault(sample.partition_id, []).append((sample.global_index, sample.custom_meta))
        topic = await self._handle.engine()
        for partition, items in by_partition.items():
            await topic.set_tags(partition, items)

    async def partitions(self) -> dict[str, dict[str, Any]]:
        """Every partition of the topic: ``{partition: {"samples": n, "cleared": n, "tasks": {task: {"consumed":
        n, "leased": n}}}}`` (samples not cleared; samples ever cleared, kept across restarts; per task, what it took
        and what it holds leased now). Reads (``get_meta`` of a partition with no samples) create no partition."""
        topic = await self._handle.engine()
        return await topic.partitions()

    @staticmethod
    def _check_take_args(batch_size: Any, task_name: Any, partition_id: Any, timeout: Any) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 0:
            raise ConfigError(f"batch_size must be an int >= 0, got {batch_size!r}")
        for label, v in (("task_name", task_name), ("partition_id", partition_id)):
            if not isinstance(v, str) or not v:
                raise ConfigError(f"{label} must be a non-empty str, got {v!r}")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout < 0):
            raise ConfigError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")

    async def get_data(
        self,
        batch_meta: BatchMeta,
        partition_id: str | None = None,
        device: Any = None,
        *,
        as_tensordict: bool | None = None,
    ) -> Any:
        """The samples of ``batch_meta``: per field, one array/tensor stacked along the batch dimension (views on
        shared memory in broker mode), a list when sample shapes differ, a list of values for other fields.

        ``as_tensordict=True`` (default: the Queue's ``as_tensordict``): a ``tensordict.TensorDict`` with
        ``batch_size=[samples]`` over the same memory instead (fields named ``a.b`` nested again)."""
        data = await self._get_data(batch_meta, partition_id, device)
        return self._shaped(data, batch_meta.size, as_tensordict)

    def _shaped(self, data: batches.Batch, n: int, as_tensordict: bool | None) -> Any:
        objects.load_all(data, self._handle.objects == "pickle")
        wanted = self._handle.as_tensordict if as_tensordict is None else as_tensordict
        return tensordicts.to_tensordict(data, n) if wanted else data

    async def _get_data(
        self, batch_meta: BatchMeta, partition_id: str | None, device: Any, payloads: bool = False, copy: bool = True
    ) -> batches.Batch:
        if not isinstance(batch_meta, BatchMeta):
            raise ConfigError(f"get_data takes the BatchMeta from get_meta or put, got {type(batch_meta).__qualname__}")
        if partition_id is not None and any(s.partition_id != partition_id for s in batch_meta.samples):
            raise ConfigError(f"this BatchMeta holds samples of {batch_meta.partition_ids}, not {partition_id!r}")
        indexes = batch_meta.global_indexes
        if not indexes:
            return batches.Batch()
        topic = await self._handle.engine()
        fields = batches.wanted_fields(batch_meta)  # (payload rows hold deduped fields under their own names)
        fields = fields if payloads else await dedup_reads.named(topic, fields, self._handle.dedup) or fields
        if (
            big := await big_batches.get(
                batch_meta,
                fields,
                topic,
                lambda m: self._get_data(m, None, device, copy=False),
                device,
                self._handle.zerocopy_mode,
                self._handle.moved,
            )
        ) is not None:
            # larger than one reply of copies: views of shared memory, else read from the spool file or in pieces
            return big
        data, zero, copied = await topic.get_data(indexes, fields, self._handle.zerocopy_mode, device, copy)
        self._handle.moved("get_zero_copy_bytes", zero)
        self._handle.moved("get_copied_bytes", copied)
        return data if payloads else await dedup_reads.resolve(data, self._get_data, device)

    async def get_batch(
        self,
        fields: Sequence[str] | None = None,
        batch_size: int = 1,
        task_name: str = "default",
        partition_id: str = "default",
        sampler: Any = None,
        device: Any = None,
        *,
        dp_rank: int | None = None,
        batch_index: int | None = None,
        wait: bool = False,
        timeout: float | None = None,
        delivery: str = "fetch",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        as_tensordict: bool | None = None,
    ) -> tuple[Any, BatchMeta]:
        """``get_meta`` then ``get_data``: (data, meta). Given ``fields``, one call of the topic does both (in broker
        mode one round trip). ``as_tensordict``: as in ``get_data``."""
        topic = await self._handle.engine()
        wanted = await dedup_reads.named(topic, data_args.field_list(fields, "get_batch"), self._handle.dedup)
        if wanted is not None:
            self._check_take_args(batch_size, task_name, partition_id, timeout)
            limit = (None if timeout is None else float(timeout)) if wait else 0.0
            sampling = (
                sampler,
                data_args.sampler_kw(dp_rank, batch_index),
                data_args.lease_of(delivery, lease_seconds),
            )
            indexes, descs, data, zero, copied = await topic.take_batch(
                partition_id, task_name, batch_size, limit, wanted, self._handle.zerocopy_mode, device, *sampling
            )
            self._handle.moved("get_zero_copy_bytes", zero)
            self._handle.moved("get_copied_bytes", copied)
            meta = batches.meta_from(indexes, partition_id, descs, wanted)
            data = await dedup_reads.resolve(data, self._get_data, device) if indexes else batches.Batch()
            return self._shaped(data, len(indexes), as_tensordict), meta
        meta = await self.get_meta(
            fields,
            batch_size,
            task_name,
            partition_id,
            sampler,
            dp_rank=dp_rank,
            batch_index=batch_index,
            wait=wait,
            timeout=timeout,
            delivery=delivery,
            lease_seconds=lease_seconds,
        )
        return await self.get_data(meta, device=device, as_tensordict=as_tensordict), meta
