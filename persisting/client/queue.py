"""Queue: the user-facing async API, over a topic that is embedded or a broker's (``topic_api.TopicAPI``).

Records are validated and encoded in the caller's thread, and decoded there on the way out, so the engine loop
does only ordering and I/O. A Queue is assembled from parts that share one ``handle.TopicHandle`` (the topic,
its settings and counters): the sample calls (get_meta, get_data, get_batch, consumption, clear, tags) come from
its base ``data_api.DataAPI``; tensor batches and reservations from a ``tensor_puts.TensorPuts`` it owns.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ..engine import TopicConfig, check_key
from ..errors import BrokerUnavailableError, ConfigError, InvalidRecordError, QueueClosedError
from ..tensors import column as tensors
from ..tensors import objects
from ..tensors.meta import BatchMeta
from ..tensors.reservation import Reservation, Reserving
from ..wire import codec
from . import _loop, keyed
from .data_api import DataAPI
from .handle import TopicHandle
from .tensor_puts import TensorPuts, check_patch, one_partition

OFFLOAD_RECORDS = 2048  # batches larger than this are encoded/decoded in a worker thread


class Queue(DataAPI):
    """A durable, ordered, Lance-backed queue of records and tensor batches: embedded, or through a broker.

    The same API either way; the docs' Concepts and Guides pages give the full contract."""

    def __init__(
        self,
        name: str,
        storage_path: str | os.PathLike[str] = "./data",
        *,
        batch_size: int = 100,
        auto_flush_interval_sec: float = 0.0,
        enable_metrics: bool = False,
        num_buckets: int = 4,
        bucket_column: str = "id",
        zerocopy_mode: str = "auto",
        backend: Any = None,
        durability: str = "sync",
        backend_options: Mapping[str, Any] | None = None,
        broker: str | None = None,
        as_tensordict: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        local_path: str | os.PathLike[str] | None = None,
        objects: str | None = None,
        dedup: bool | Sequence[str] = False,
        pin_memory: bool | None = None,
    ) -> None:
        config = TopicConfig(
            num_buckets=num_buckets,
            bucket_column=bucket_column,
            batch_size=batch_size,
            auto_flush_interval_sec=auto_flush_interval_sec,
            durability=durability,
            backend_kwargs=dict(backend_options or {}),
        )
        handle = TopicHandle(
            name,
            storage_path,
            config,
            zerocopy_mode=zerocopy_mode,
            enable_metrics=enable_metrics,
            backend=backend,
            broker=broker,
            as_tensordict=as_tensordict,
            storage_options=storage_options,
            local_path=local_path,
            objects=objects,
            dedup=dedup,
            pin_memory=pin_memory,
        )
        super().__init__(handle)
        self.name = handle.name
        self.storage_path = handle.storage_path  # a local folder, or the object-store URI
        self.location = handle.location
        self.zerocopy_mode = handle.zerocopy_mode
        self.as_tensordict = handle.as_tensordict  # get_data/get_batch default (tensordict extra)
        self.objects = handle.objects  # "pickle": Python objects pickled by this process (tensors/objects.py)
        self.enable_metrics = handle.enable_metrics
        self.pin_memory = handle.pin_memory  # shared memory page-locked for CUDA (the argument, else the env)
        self.broker = handle.broker
        self.batch_size = batch_size
        self._tensors = TensorPuts(handle, self)

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, storage_path={str(self.storage_path)!r})"

    # -- lifecycle ----------------------------------------------------------------------------------

    async def open(self) -> Queue:
        """Open the topic (replaying its log after a crash). Called for you by the first operation."""
        await self._handle.engine()
        return self

    async def aclose(self) -> None:
        """Flush and release the topic. Idempotent."""
        if self._handle.closed:
            return
        self._handle.closed = True
        await self._tensors.close()
        await self._handle.aclose()

    def close(self) -> None:
        """Blocking twin of ``aclose`` (flushes). From async code prefer ``await q.aclose()``."""
        _loop.run(self.aclose())

    async def __aenter__(self) -> Queue:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- writing ------------------------------------------------------------------------------------

    async def put(
        self,
        data: Any,
        partition_id: str | None = None,
        *,
        batch_meta: BatchMeta | None = None,
        timeout: float | None = None,
        extra: Mapping[str, Sequence[Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> BatchMeta | None:
        """Store one record, or a tensor batch; returns once it is acknowledged (see ``durability``).

        ``put(record)``: one dict record, returns None. ``put(data, partition_id=...)`` (or a TensorDict): a
        batch, a mapping of numpy arrays / torch tensors sharing the leading dimension (lists of per-sample
        values may ride along); each sample becomes one row; returns its ``BatchMeta``. In broker mode the
        batch goes through the shared-memory arena (see ``zerocopy_mode``); a full arena makes this wait up
        to ``timeout`` seconds (default 30) and then raise ``Full``.

        ``batch_meta``: write more fields of samples that exist (the meta from ``put`` or ``get_meta``; row k of
        ``data`` goes to its k-th sample). Returns that meta with the new fields; ``get_meta`` asking for them
        hands the samples out once every field it asks for is written. A field written again reads back as its
        latest value.

        ``put(reservation)``: store a batch reserved with ``reserve`` and filled in place (no copy of its tensors
        in broker mode with an arena); ``extra``: its non-tensor fields, ``{field: list of batch_size values}``;
        ``partition_id``, if given, must be the reservation's; ``batch_meta`` works as above; ``timeout`` applies
        only if the broker restarted since the reserve (the batch then needs a fresh extent). Arguments refused
        here leave the reservation open; a put that fails once it reached the store gives it back.

        ``idempotency_key``: a put sent again with the key of an earlier one is stored once and returns what
        the first returned (``BrokerUnavailableError.idempotency_key`` carries the key a failed put was sent
        with; see docs/concepts/safe-retries.md).
        """
        key = await self._put_key(idempotency_key)
        try:
            if type(data) is dict and partition_id is None and batch_meta is None and extra is None:
                # The common case, one plain record: straight to its append, without _put's dispatch on what
                # data is (a coroutine layer and ABC isinstance checks); what _put would do, errors included.
                await self._append([data], "default", key)
                return None
            return await self._put(data, partition_id, batch_meta, timeout, extra, key)
        except BrokerUnavailableError as exc:
            exc.idempotency_key = key
            raise

    async def _put(
        self,
        data: Any,
        partition_id: str | None,
        batch_meta: BatchMeta | None,
        timeout: float | None,
        extra: Mapping[str, Sequence[Any]] | None,
        key: str | None,
    ) -> BatchMeta | None:
        if isinstance(data, Reservation):
            return await self._tensors.put_reserved(data, partition_id, batch_meta, timeout, extra, key)
        if isinstance(data, Reserving):
            data.close()
            raise ConfigError("put() takes the Reservation: await q.reserve(...) first (or use async with)")
        if extra is not None:
            raise ConfigError("extra= goes with put(reservation); in a tensor batch, give per-sample lists as fields")
        if batch_meta is not None:
            if not isinstance(batch_meta, BatchMeta):
                raise ConfigError(
                    f"batch_meta must be the BatchMeta of the samples, got {type(batch_meta).__qualname__}"
                )
            partition = partition_id if partition_id is not None else one_partition(batch_meta)
            check_patch(batch_meta, partition)
            return await self._tensors.put_tensors(data, partition, timeout, batch_meta, key)
        if partition_id is not None or tensors.is_tensor_dict(data):
            return await self._tensors.put_tensors(data, partition_id or "default", timeout, key=key)
        record = data
        if not isinstance(record, Mapping):
            raise InvalidRecordError(
                f"put() takes a dict record, got {type(record).__qualname__}; use put_batch() for a list of records"
            )
        await self._append([record], "default", key)
        return None

    async def _put_key(self, given: str | None) -> str | None:
        """The key a put is sent with: the caller's, else (broker mode) a fresh one, so that the connection's
        re-sends and a retry after ``BrokerUnavailableError`` are stored once; embedded, none unless given."""
        if given is not None:
            check_key(given)
            return given
        return (await self._handle.engine()).new_put_key()

    def reserve(
        self,
        spec: Mapping[str, tuple[Any, Any]],
        batch_size: int,
        partition_id: str = "default",
        *,
        timeout: float | None = None,
    ) -> Reserving:
        """Reserve a tensor batch to fill in place: ``r = await q.reserve({"obs": ((4096,), np.float32), "m": ((),
        torch.bfloat16)}, batch_size=256, partition_id="p")``, write ``r["obs"][:] = ...``, then ``await q.put(r)``.

        ``spec``: field -> (sample shape, dtype); a numpy dtype (or name) gives a numpy array, a torch dtype a torch
        tensor, each ``(batch_size, *sample_shape)``, writable, contents undefined until written. In broker mode
        with an arena they lie in the broker's shared memory (``r.in_arena``): ``put(r)`` copies nothing. Otherwise
        (embedded mode, ``zerocopy_mode="off"``, no arena, a batch larger than the arena) they are plain memory and
        ``put`` copies them; ``zerocopy_mode="force"`` raises ``ConfigError`` there instead. A full arena makes this
        wait up to ``timeout`` seconds (None: 30, as ``put``), then raise ``Full``.

        ``async with q.reserve(...) as r:`` gives the space back on leaving the block unless ``r`` was put;
        ``await r.abandon()`` (or ``q.abandon(r)``) does it at once. A bad spec raises ``InvalidRecordError`` naming
        the field; a bad ``batch_size`` or ``timeout`` ``ConfigError``. See ``persisting.reservation``.
        """
        return Reserving(self._tensors.reserve(spec, batch_size, partition_id, timeout))

    async def _reserve(self, spec: Any, batch_size: Any, partition_id: Any, timeout: Any) -> Reservation:
        return await self._tensors.reserve(spec, batch_size, partition_id, timeout)

    async def abandon(self, reservation: Reservation) -> bool:
        """``await reservation.abandon()``: give a reservation's space back unless it was put (then False)."""
        if not isinstance(reservation, Reservation):
            raise ConfigError(f"abandon() takes a Reservation from reserve(), got {type(reservation).__qualname__}")
        reservation._check_owner(self)
        return await reservation.abandon()

    async def put_batch(
        self,
        records: Sequence[Mapping[str, Any]],
        partition_id: str = "default",
        *,
        idempotency_key: str | None = None,
    ) -> range:
        """Store records atomically (all or none) and in order; one log frame and one sync for the batch.
        Returns their global indexes (consecutive).

        ``idempotency_key``: as in ``put``; a batch sent again with the key of an earlier one is stored once and
        returns the first one's indexes."""
        key = await self._put_key(idempotency_key)
        try:
            return await self._put_batch(records, partition_id, key)
        except BrokerUnavailableError as exc:
            exc.idempotency_key = key
            raise

    async def _put_batch(self, records: Sequence[Mapping[str, Any]], partition_id: str, key: str | None) -> range:
        if isinstance(records, Mapping) or not isinstance(records, Sequence) or isinstance(records, str | bytes):
            raise InvalidRecordError(f"put_batch() takes a list of dict records, got {type(records).__qualname__}")
        codec.check_partition(partition_id)
        return await self._append(records, partition_id, key)

    async def _append(self, records: Sequence[Mapping[str, Any]], partition_id: str, key: str | None) -> range:
        """Encode records (checked to be a list of them) and append them to ``partition_id``."""
        topic = await self._handle.engine()
        if len(records) > OFFLOAD_RECORDS:
            batch, blob = await asyncio.to_thread(_encode, records, topic.kinds)
        else:
            batch, blob = _encode(records, topic.kinds)
        first, n = await topic.append(batch, partition_id, blob, key)
        return range(first, first + n)

    async def flush(self) -> None:
        """Move everything acknowledged so far into Lance (puts are already durable without this)."""
        topic = await self._handle.engine()
        await topic.flush()

    # -- reading ------------------------------------------------------------------------------------

    async def get(self, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
        """Records with global index in ``[offset, offset + limit)``, in index order."""
        rows, _next = await self._read(limit, offset)
        return rows

    async def _read(
        self, limit: int, offset: int, *, wait: bool = False, timeout: float | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        for label, v in (("limit", limit), ("offset", offset)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{label} must be an int >= 0, got {v!r}")
        topic = await self._handle.engine()
        if wait:
            rows, kinds, end = await topic.read_waiting(offset, limit, timeout)
        else:
            rows, kinds, end = await topic.read_window(offset, limit)
        if len(rows) > OFFLOAD_RECORDS:
            records = await asyncio.to_thread(_decode, rows, kinds)
        else:
            records = _decode(rows, kinds)
        if any(kind == objects.KIND for kind in kinds.values()):
            for record in records:
                objects.load_all(record, self.objects == "pickle")
        return records, end

    async def stream(
        self,
        limit: int | None = None,
        offset: int = 0,
        wait: bool = False,
        timeout: float | None = None,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield lists of records from ``offset`` on, ``batch_size`` at a time, until ``limit`` records.

        At the end of the data: stop if ``wait`` is false; otherwise wait for more, and stop once ``timeout``
        seconds pass with nothing new (``None``: wait for ever). Waiting is a notification, not a poll.
        """
        pos = offset
        remaining = limit
        while remaining is None or remaining > 0:
            want = self.batch_size if remaining is None else min(self.batch_size, remaining)
            # the read itself waits (through a broker a long poll, one round trip per page)
            records, end = await self._read(want, pos, wait=wait, timeout=timeout)
            if records:
                pos = end
                if remaining is not None:
                    remaining -= len(records)
                yield records
                continue
            if end > pos:  # a window of cleared samples' rows only
                pos = end
                continue
            return  # nothing came within the timeout (or nothing was to be waited for)

    async def stats(self) -> dict[str, Any]:
        topic = await self._handle.engine()
        out: dict[str, Any] = await topic.stats()
        out["zerocopy_mode"] = self.zerocopy_mode
        out["zerocopy"] = self._handle.transfers()  # bytes of tensor payload moved by this Queue, by path
        return out

    def __len__(self) -> int:
        """Records stored and acknowledged (flushed or not). Opens the topic first if needed (blocking)."""
        if self._handle.opened is None and not _loop.on_engine_loop():
            _loop.run(self.open())
        topic = self._handle.opened
        if topic is None:
            raise QueueClosedError(f"queue {self.name!r} is not open; await q.open() first")
        return topic.current_count()

    async def kv_put(
        self,
        keys: Sequence[str],
        data: Any = None,
        partition_id: str = "default",
        *,
        tags: Sequence[Mapping[str, Any] | None] | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> BatchMeta:
        """Keyed samples (engine/keys.py): write their fields (row k of ``data``, a tensor batch, or None, is
        ``keys[k]``'s) and merge ``tags`` (a dict per key) in one round trip. A key naming no sample gets a new one
        (data, key, tags stored together); one that does, the fields written again. Returns the keys' samples."""
        key = await self._put_key(idempotency_key)
        try:
            return await keyed.put(self._handle, self._tensors, keys, data, partition_id, tags, timeout, key)
        except BrokerUnavailableError as exc:
            exc.idempotency_key = key
            raise

    async def kv_get(
        self, keys: Sequence[str], partition_id: str = "default", *, fields: Any = None, device: Any = None
    ) -> tuple[Any, BatchMeta]:
        """(data, meta) of the keys' samples in one round trip: meta of those found (``extra_info``: keys, missing),
        data: ``fields`` all of them have (None: all they share), as ``get_data`` gives; None if nothing to read."""
        data, meta = await keyed.get(self._handle, keys, partition_id, fields, device, self._get_data)
        return (None if data is None else self._shaped(data, meta.size, None)), meta

    async def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tags}}`` of every key (of ``partition_id`` only, if given)."""
        return await keyed.listing(self._handle, partition_id)

    async def kv_clear(self, keys: Sequence[str], partition_id: str = "default") -> int:
        """Clear the samples ``keys`` name (others are skipped); returns how many. A key put again starts anew."""
        return await keyed.clear(self._handle, keys, partition_id)

    async def kv_names(self, global_indexes: Sequence[int], partition_id: str = "default") -> list[str | None]:
        """The key each sample carries (None: none, or it was cleared)."""
        return await keyed.names(self._handle, global_indexes, partition_id)


def _encode(records: Sequence[Mapping[str, Any]], kinds: Mapping[str, str]) -> tuple[codec.EncodedBatch, bytes]:
    batch = codec.encode_batch(records, kinds)
    return batch, codec.pack(batch.rows)


def _decode(rows: list[dict[str, Any]], kinds: Mapping[str, str]) -> list[dict[str, Any]]:
    return codec.decode_rows(rows, kinds)
