"""Queue: the user-facing async API. In embedded mode it drives the engine on the background engine loop.

Several ``Queue`` (or ``SyncQueue``) objects of one topic in one process share one engine (a registry keyed by
storage path and name); the topic's files are locked against other processes. Records are validated and
encoded in the caller's thread, and decoded there on the way out, so the engine loop does only ordering and I/O.
The sample calls (get_meta, get_data, get_batch, consumption, clear, tags) are in data_api.py, a mixin of Queue;
reservations (``reserve``: a tensor batch the producer fills in place) in reservation.py.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..engine.layout import topic_dirname
from ..engine.location import Location, object_store_topic, parse_location
from ..engine.topic import BackendFactory, Topic, TopicConfig
from ..errors import ConfigError, InvalidRecordError, QueueClosedError
from ..queue.lance_backend import LanceBackend
from ..queue.persisting_backend import PersistingBackend
from ..tensors import batches, reservation
from ..tensors import column as tensors
from ..tensors.meta import BatchMeta
from ..tensors.reservation import Reservation, Reserving
from ..wire import codec
from . import _loop
from .data_api import DataAPI, on_topic
from .remote import RemoteTopic

T = TypeVar("T")
ZEROCOPY_MODES = ("auto", "force", "off")
LEASE_TIMEOUT_S = 30.0  # how long a tensor put waits for arena space by default before Full
OFFLOAD_RECORDS = 2048  # batches larger than this are encoded/decoded in a worker thread

_topics: dict[tuple[str, str], tuple[Topic, set[int]]] = {}
_registry_lock: asyncio.Lock | None = None


async def _acquire(name: str, location: Location, config: TopicConfig, factory: BackendFactory, holder: int) -> Topic:
    global _registry_lock
    if _registry_lock is None:
        _registry_lock = asyncio.Lock()
    async with _registry_lock:
        key = (str(location.local), name)  # the local root: one per object-store URI too
        entry = _topics.get(key)
        if entry is not None:
            topic, holders = entry
            for attr in ("num_buckets", "bucket_column", "durability"):
                if getattr(topic.config, attr) != getattr(config, attr):
                    raise ConfigError(
                        f"topic {name!r} is already open in this process with "
                        f"{attr}={getattr(topic.config, attr)!r}; this Queue asks for "
                        f"{attr}={getattr(config, attr)!r}"
                    )
            holders.add(holder)
            return topic
        remote = object_store_topic(location, name, topic_dirname(name))
        topic = Topic(name, location.local, config, factory, remote=remote)
        try:
            await topic.open()
        except BaseException:
            await topic.close_quietly()
            raise
        _topics[key] = (topic, {holder})
        return topic


async def _release(topic: Topic, holder: int) -> None:
    key = (str(topic.path.parent), topic.name)
    entry = _topics.get(key)
    if entry is None:
        return
    entry[1].discard(holder)
    if not entry[1]:
        del _topics[key]
        await topic.close()


def _resolve_backend(backend: Any, enable_metrics: bool) -> BackendFactory:
    if backend is None:
        return PersistingBackend if enable_metrics else LanceBackend
    if isinstance(backend, type) or callable(backend):
        return backend
    raise ConfigError(
        f"backend must be a class or a factory called as backend(bucket_id, storage_path, batch_size=...), "
        f"got an instance of {type(backend).__qualname__}; pass its class"
    )


class Queue(DataAPI):
    """A durable, ordered, Lance-backed queue of records. See the README for the full contract."""

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
        storage_options: Mapping[str, Any] | None = None,
        local_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or "\x00" in name:
            raise ConfigError(f"name must be a non-empty str without NUL characters, got {name!r}")
        if zerocopy_mode not in ZEROCOPY_MODES:
            raise ConfigError(f"zerocopy_mode must be one of {ZEROCOPY_MODES}, got {zerocopy_mode!r}")
        self.name = name
        # A local folder or an object-store URI (s3://, gs://, az://): checked here, refused with the reason.
        self.location = parse_location(storage_path, storage_options, local_path)
        self.storage_path: Path | str = self.location.uri or self.location.local
        self.zerocopy_mode = zerocopy_mode
        self.enable_metrics = bool(enable_metrics)
        self.batch_size = batch_size
        self._config = TopicConfig(
            num_buckets=num_buckets,
            bucket_column=bucket_column,
            batch_size=batch_size,
            auto_flush_interval_sec=auto_flush_interval_sec,
            durability=durability,
            backend_kwargs=dict(backend_options or {}),
        )
        self._config.validate()
        self._factory = _resolve_backend(backend, self.enable_metrics)
        # Broker mode: an explicit address, else PERSISTING_BROKER; the broker owns storage_path then.
        self.broker = broker if broker is not None else (os.environ.get("PERSISTING_BROKER") or None)
        if self.broker is not None and (backend is not None or backend_options):
            raise ConfigError("backend and backend_options are the broker's settings in broker mode")
        if self.broker is not None and (storage_options or local_path is not None):
            raise ConfigError("storage_options and local_path are the broker's settings in broker mode")
        if self.location.remote and backend is not None:
            raise ConfigError("an object-store storage_path is written by the built-in Lance backend; omit backend")
        self._topic: Topic | RemoteTopic | None = None
        self._closed = False
        self._moved = dict.fromkeys(
            ("put_zero_copy_bytes", "put_copied_bytes", "get_zero_copy_bytes", "get_copied_bytes"), 0
        )
        self._reservations: weakref.WeakSet[Reservation] = weakref.WeakSet()  # given back at close if not put

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, storage_path={str(self.storage_path)!r})"

    # -- lifecycle ----------------------------------------------------------------------------------

    async def open(self) -> Queue:
        """Open the topic (replaying its log after a crash). Called for you by the first operation."""
        await self._engine()
        return self

    async def _engine(self) -> Topic | RemoteTopic:
        if self._closed:
            raise QueueClosedError(f"queue {self.name!r} is closed; open a new Queue")
        if self._topic is None:
            if self.broker is not None:
                remote = RemoteTopic(self.name, self.broker, self._config)
                await remote.open()  # broker mode runs on the caller's loop
                self._topic = remote
            else:
                self._topic = await _loop.call(
                    _acquire(self.name, self.location, self._config, self._factory, id(self))
                )
        return self._topic

    async def aclose(self) -> None:
        """Flush and release the topic. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(r._close() for r in list(self._reservations)))
        topic, self._topic = self._topic, None
        if isinstance(topic, Topic):
            await _loop.call(_release(topic, id(self)))
        elif isinstance(topic, RemoteTopic):
            await topic.aclose()

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
        """
        if isinstance(data, Reservation):
            return await self._put_reserved(data, partition_id, batch_meta, timeout, extra)
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
            partition = partition_id if partition_id is not None else _one_partition(batch_meta)
            _check_patch(batch_meta, partition)
            return await self._put_tensors(data, partition, timeout, batch_meta)
        if partition_id is not None or tensors.is_tensor_dict(data):
            return await self._put_tensors(data, partition_id or "default", timeout)
        record = data
        if not isinstance(record, Mapping):
            raise InvalidRecordError(
                f"put() takes a dict record, got {type(record).__qualname__}; use put_batch() for a list of records"
            )
        await self.put_batch([record])
        return None

    async def _put_tensors(
        self, data: Any, partition: str, timeout: float | None, patch: BatchMeta | None = None
    ) -> BatchMeta:
        if not isinstance(partition, str) or not partition:
            raise InvalidRecordError(f"partition_id must be a non-empty str, got {partition!r}")
        columns, other, n = tensors.split(data)
        of = None
        if patch is not None:
            if n != patch.size:
                raise ConfigError(f"data holds {n} samples but batch_meta names {patch.size}; give one row per sample")
            of = patch.global_indexes
        topic = await self._engine()
        if n == 0:
            return patch if patch is not None else BatchMeta()
        payload = sum(col.array.nbytes for col in columns.values())
        remote = await self._through_arena(topic) if columns else None
        if remote is not None:
            plain = batches.other_rows(other, n, remote.kinds)
            try:
                first, n = await remote.put_tensors(
                    columns,
                    plain,
                    codec.pack(plain.rows),
                    n,
                    partition,
                    LEASE_TIMEOUT_S if timeout is None else timeout,
                    of,
                )
                self._moved["put_zero_copy_bytes"] += payload
                return batches.batch_meta(first, n, partition, columns, other, patch)
            except ConfigError as exc:
                if not self._copy_instead(exc):
                    raise
        return await self._put_copied(topic, columns, other, n, partition, patch)

    async def _through_arena(self, topic: Topic | RemoteTopic) -> RemoteTopic | None:
        """The broker topic if a tensor batch goes through its arena (put and reserve decide alike), else None;
        ``"force"`` refuses where it cannot."""
        if isinstance(topic, RemoteTopic) and self.zerocopy_mode != "off":
            if await topic.has_arena():
                return topic
            if self.zerocopy_mode == "force":
                raise ConfigError("zerocopy_mode='force': the broker runs without an arena (--arena-bytes)")
        elif self.zerocopy_mode == "force":
            raise ConfigError(
                "zerocopy_mode='force' needs broker mode (shared memory between processes); embedded mode copies"
            )
        return None

    def _copy_instead(self, exc: ConfigError) -> bool:
        """A batch larger than the arena is copied over the socket, unless ``"force"`` refuses that."""
        return self.zerocopy_mode != "force" and "larger than the arena" in str(exc)

    async def _put_copied(
        self,
        topic: Topic | RemoteTopic,
        columns: dict[str, tensors.Column],
        other: dict[str, list[Any]],
        n: int,
        partition: str,
        patch: BatchMeta | None,
    ) -> BatchMeta:
        """The copy path: every sample encoded into a row, stored like records."""
        batch = await asyncio.to_thread(batches.full_rows, columns, other, n, topic.kinds)
        blob = await asyncio.to_thread(codec.pack, batch.rows)
        of = None if patch is None else patch.global_indexes
        first, n = await on_topic(topic, topic.append(batch, partition, blob, of=of))
        self._moved["put_copied_bytes"] += sum(col.array.nbytes for col in columns.values())
        return batches.batch_meta(first, n, partition, columns, other, patch)

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
        return Reserving(self._reserve(spec, batch_size, partition_id, timeout))

    async def _reserve(self, spec: Any, batch_size: Any, partition_id: Any, timeout: Any) -> Reservation:
        n = reservation.check_batch_size(batch_size)
        if not isinstance(partition_id, str) or not partition_id:
            raise InvalidRecordError(f"partition_id must be a non-empty str, got {partition_id!r}")
        if timeout is not None and (not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0):
            raise ConfigError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        topic = await self._engine()
        fields = reservation.parse_spec(spec, topic.kinds)
        r = None
        if n == 0:  # as put of an empty batch: nothing to lease, nothing stored
            pass
        elif (remote := await self._through_arena(topic)) is not None:
            wait = LEASE_TIMEOUT_S if timeout is None else float(timeout)
            try:
                r = await reservation.in_arena(self, remote, fields, n, partition_id, wait)
            except ConfigError as exc:
                if not self._copy_instead(exc):
                    raise
        if r is None:
            r = reservation.plain(self, fields, n, partition_id)
        self._reservations.add(r)
        return r

    async def abandon(self, reservation: Reservation) -> bool:
        """``await reservation.abandon()``: give a reservation's space back unless it was put (then False)."""
        if not isinstance(reservation, Reservation):
            raise ConfigError(f"abandon() takes a Reservation from reserve(), got {type(reservation).__qualname__}")
        reservation._check_owner(self)
        return await reservation.abandon()

    async def _put_reserved(
        self,
        r: Reservation,
        partition_id: str | None,
        patch: BatchMeta | None,
        timeout: float | None,
        extra: Any,
    ) -> BatchMeta:
        # Bad arguments are refused before the reservation is touched: it stays open for a corrected put.
        r._check_put(self)
        if partition_id is not None and partition_id != r.partition_id:
            raise ConfigError(f"this reservation is for partition {r.partition_id!r}, not {partition_id!r}")
        if patch is not None:
            _check_patch(patch, r.partition_id)
            if patch.size != r.batch_size:
                raise ConfigError(f"the reservation holds {r.batch_size} samples but batch_meta names {patch.size}")
        other = reservation.check_extra(extra, r._fields, r.batch_size)
        topic = await self._engine()
        plain = batches.other_rows(other, r.batch_size, topic.kinds)  # refuses bad values now, not in the store
        r._begin_put(self)
        try:
            columns = r._columns()
            if r.batch_size == 0:
                meta = patch if patch is not None else BatchMeta()
            elif r._lease is not None and r._places is not None and isinstance(topic, RemoteTopic):
                wait = LEASE_TIMEOUT_S if timeout is None else timeout  # only if the broker restarted meanwhile
                of = None if patch is None else patch.global_indexes
                args = (r._lease, r._places, plain, codec.pack(plain.rows), r.batch_size, r.partition_id, wait, of)
                first, n = await topic.put_reserved(*args)
                self._moved["put_zero_copy_bytes"] += r.nbytes
                meta = batches.batch_meta(first, n, r.partition_id, columns, other, patch)
            else:
                meta = await self._put_copied(topic, columns, other, r.batch_size, r.partition_id, patch)
        except BaseException as exc:
            r._put_failed(exc)
            raise
        r._put_done(meta)
        return meta

    async def put_batch(self, records: Sequence[Mapping[str, Any]], partition_id: str = "default") -> None:
        """Store records atomically (all or none) and in order; one log frame and one sync for the batch."""
        if isinstance(records, Mapping) or not isinstance(records, Sequence) or isinstance(records, str | bytes):
            raise InvalidRecordError(f"put_batch() takes a list of dict records, got {type(records).__qualname__}")
        if not isinstance(partition_id, str) or not partition_id:
            raise InvalidRecordError(f"partition_id must be a non-empty str, got {partition_id!r}")
        topic = await self._engine()
        if len(records) > OFFLOAD_RECORDS:
            batch, blob = await asyncio.to_thread(_encode, records, topic.kinds)
        else:
            batch, blob = _encode(records, topic.kinds)
        await on_topic(topic, topic.append(batch, partition_id, blob))

    async def flush(self) -> None:
        """Move everything acknowledged so far into Lance (puts are already durable without this)."""
        topic = await self._engine()
        await on_topic(topic, topic.flush())

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
        topic = await self._engine()
        if wait and isinstance(topic, RemoteTopic):
            rows, kinds, end = await topic.read_waiting(offset, limit, timeout)
        else:
            rows, kinds, end = await on_topic(topic, topic.read_window(offset, limit))
        if len(rows) > OFFLOAD_RECORDS:
            records = await asyncio.to_thread(_decode, rows, kinds)
        else:
            records = _decode(rows, kinds)
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
        # Through a broker the read itself waits (one round trip per page); embedded, read then wait_beyond.
        long_poll = wait and isinstance(await self._engine(), RemoteTopic)
        while remaining is None or remaining > 0:
            want = self.batch_size if remaining is None else min(self.batch_size, remaining)
            records, end = await self._read(want, pos, wait=long_poll, timeout=timeout)
            if records:
                pos = end
                if remaining is not None:
                    remaining -= len(records)
                yield records
                continue
            if end > pos:  # a window of cleared samples' rows only
                pos = end
                continue
            if not wait or long_poll:
                return
            topic = await self._engine()
            if not await on_topic(topic, topic.wait_beyond(pos, timeout)):
                return

    async def stats(self) -> dict[str, Any]:
        topic = await self._engine()
        out: dict[str, Any] = await on_topic(topic, topic.stats())
        out["zerocopy_mode"] = self.zerocopy_mode
        out["zerocopy"] = dict(self._moved)  # bytes of tensor payload moved by this Queue, by path
        if self.enable_metrics and isinstance(topic, Topic):
            m = topic.metrics
            out["metrics"] = {
                "puts": m.puts,
                "records_put": m.records_put,
                "gets": m.gets,
                "records_read": m.records_read,
                "flushes": m.flushes,
                "records_flushed": m.records_flushed,
                "flush_seconds": m.flush_seconds,
                "commit_seconds": m.commit_seconds,
            }
        return out

    def __len__(self) -> int:
        """Records stored and acknowledged (flushed or not). Opens the topic first if needed (blocking)."""
        if self._topic is None and not _loop.on_engine_loop():
            _loop.run(self.open())
        topic = self._topic
        if topic is None:
            raise QueueClosedError(f"queue {self.name!r} is not open; await q.open() first")
        if isinstance(topic, RemoteTopic) and not _loop.on_engine_loop():
            return _loop.run(topic.fetch_count())
        return topic.count()


def _check_patch(meta: Any, partition: str) -> None:
    if not isinstance(meta, BatchMeta):
        raise ConfigError(f"batch_meta must be the BatchMeta of the samples, got {type(meta).__qualname__}")
    if any(s.partition_id != partition for s in meta.samples):
        raise ConfigError(f"batch_meta holds samples of {meta.partition_ids}, not of {partition!r}")


def _one_partition(meta: BatchMeta) -> str:
    parts = meta.partition_ids
    if len(parts) > 1:
        raise ConfigError(f"batch_meta holds samples of several partitions {parts}; put to each one separately")
    return parts[0] if parts else "default"


def _encode(records: Sequence[Mapping[str, Any]], kinds: Mapping[str, str]) -> tuple[codec.EncodedBatch, bytes]:
    batch = codec.encode_batch(records, kinds)
    return batch, codec.pack(batch.rows)


def _decode(rows: list[dict[str, Any]], kinds: Mapping[str, str]) -> list[dict[str, Any]]:
    return codec.decode_rows(rows, kinds)
