"""Tensor batches from a ``Queue``: put (through the broker's arena, or copied into rows) and reservations.

``TensorPuts`` is composed into ``queue.Queue`` and uses the topic through its ``handle.TopicHandle``. The arena or
the copy is decided in one place (``_through_arena``), for put and reserve alike: a topic with shared memory (a
broker with an arena) and ``zerocopy_mode`` not ``"off"`` goes through the arena; ``"force"`` refuses where that
cannot be; a batch larger than the arena is copied over the socket (``_copy_instead``). Reservations (``reserve``:
a batch the producer fills in place) are made here and sealed by ``put_reserved``; those not put are given back at
close.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigError, DedupConflictError, InvalidRecordError, MemoryFull, PayloadClearedError
from ..tensors import batches, dedup, objects, pieces, reservation, tensordicts
from ..tensors import column as tensors
from ..tensors.meta import BatchMeta
from ..tensors.reservation import Reservation
from ..wire import codec
from . import big_batches
from .handle import TopicHandle

if TYPE_CHECKING:
    from .remote_tensors import ArenaClient
    from .topic_api import TopicAPI

T = TypeVar("T")

LEASE_TIMEOUT_S = 30.0  # how long a tensor put waits for arena space by default before Full
# Memory pressure: a put of dense tensors that finds the broker's shared-memory budget full for this long (or for
# its whole timeout, if shorter) spills to a spool file on disk instead of waiting on (docs/concepts/batch-sizes.md).
SPILL_AFTER_SECONDS = float(os.environ.get("PERSISTING_SPILL_AFTER_S", "1.0"))


class TensorPuts:
    def __init__(self, handle: TopicHandle, owner: object) -> None:
        self._handle = handle
        self._owner = owner  # the Queue: reservations check that they are put through the queue that made them
        self._reservations: weakref.WeakSet[Reservation] = weakref.WeakSet()  # given back at close if not put
        self._index = dedup.ContentIndex()  # what this producer stored, for dedup across its puts

    async def close(self) -> None:
        """Give back every reservation not put."""
        await asyncio.gather(*(r._close() for r in list(self._reservations)))

    async def put_tensors(
        self, data: Any, partition: str, timeout: float | None, patch: BatchMeta | None = None, key: str | None = None
    ) -> BatchMeta:
        codec.check_partition(partition)
        non_tensor: set[str] = set()
        if tensors.is_tensor_dict(data):
            # nested keys become "a.b" fields; get_data(as_tensordict=True) nests them again
            data = tensordicts.flatten(data, non_tensor)
        columns, other, n = tensors.split(data)
        codec.check_names("tensor batch field", (*columns, *other))
        if patch is not None and n != patch.size:
            raise ConfigError(f"data holds {n} samples but batch_meta names {patch.size}; give one row per sample")
        topic = await self._handle.engine()
        other = objects.prepare(other, non_tensor, self._handle.objects, topic.kinds, _storable)
        if n == 0:
            return patch if patch is not None else BatchMeta()
        return await self.deduped(
            topic,
            columns,
            other,
            partition,
            timeout,
            key,
            lambda c, o, b: self._store(topic, c, o, n, partition, timeout, patch, key, b),
        )

    async def deduped(
        self,
        topic: TopicAPI,
        columns: dict[str, tensors.AnyColumn],
        other: dict[str, list[Any]],
        partition: str,
        timeout: float | None,
        key: str | None,
        store: Callable[[dict[str, tensors.AnyColumn], dict[str, list[Any]], tuple[int, int] | None], Awaitable[T]],
    ) -> T:
        """``store`` a put's fields, the deduped ones' new distinct values stored first and the fields turned into
        references (tensors/dedup.py), with the bytes (put, stored) of those fields; as given where dedup applies
        to none. The engine refuses samples that reference a value cleared meanwhile (``PayloadClearedError``:
        its last sample was cleared, maybe by another process): the values this put found in the content index
        are forgotten and stored again. It refuses a field stored the other way than the topic stores it
        (``DedupConflictError``): under ``"auto"`` the topic's choice is looked up and the put made again."""
        mode = self._handle.dedup
        if mode == dedup.AUTO and (new := dedup.undecided(columns, other, topic.kinds)):
            # decided by how the topic stores each field: learn what other processes put (once per new field,
            # a stats round trip; then the first put of a field this process has not seen costs two)
            await topic.refresh_kinds(new)
        attempt = -1
        while True:
            attempt += 1
            last = attempt == dedup.PUT_ATTEMPTS - 1
            names = dedup.chosen(mode, columns, other, topic.kinds)
            try:
                if not names:
                    return await store(columns, other, None)
                putter = self._payload_putter(partition, timeout, key, attempt)
                plan = await dedup.plan(names, columns, other, partition, self._index, putter)
                self._handle.moved("dedup_stored_bytes", plan.stored_bytes)
                try:
                    result = await store(plan.columns, plan.other, (plan.put_bytes, plan.stored_bytes))
                except PayloadClearedError as exc:
                    self._index.drop(partition, plan.reused, exc.rows)  # forget those cleared, store them again
                    if last:
                        raise
                    continue
                self._handle.moved("dedup_put_bytes", plan.put_bytes)
                return result
            except DedupConflictError:
                # another process stored a field first, the other way ("auto" decided on what this process knew
                # then): learn how the topic stores it and put again; a dedup the caller named is theirs to change
                if mode != dedup.AUTO or last:
                    raise
                await topic.refresh_kinds(None)

    def _payload_putter(self, partition: str, timeout: float | None, key: str | None, attempt: int) -> dedup.PutPayload:
        """Stores the new distinct values of a deduped field as rows of the partition's payload partition."""
        topic = self._handle.opened

        async def put_payload(name: str, part: tensors.AnyColumn | list[Any], count: int) -> int:
            if topic is None:
                raise ConfigError("the queue's topic closed during a put")
            cols = {} if isinstance(part, list) else {name: part}
            other = {name: part} if isinstance(part, list) else {}
            sub = None if key is None else dedup.payload_key(key, name, attempt)
            where = dedup.payload_partition(partition)
            meta = await self._store(topic, cols, other, count, where, timeout, None, sub, None, lease_ahead=False)
            return meta.global_indexes[0]

        return put_payload

    async def _store(
        self,
        topic: TopicAPI,
        columns: Mapping[str, tensors.AnyColumn],
        other: dict[str, list[Any]],
        n: int,
        partition: str,
        timeout: float | None,
        patch: BatchMeta | None,
        key: str | None,
        dedup_bytes: tuple[int, int] | None,
        lease_ahead: bool = True,
    ) -> BatchMeta:
        """Store a prepared batch: through the broker's arena where it can, else copied into rows."""
        payload = sum(col.nbytes for col in columns.values())

        async def spooled() -> BatchMeta:
            """Through a spool file (written and synced): a batch above the budget, or shared memory full."""
            meta = await big_batches.spool(topic, columns, other, n, partition, patch, key)
            self._handle.moved("put_spooled_bytes", payload)
            return meta

        if self._handle.zerocopy_mode != "force" and await big_batches.above_limit(topic, columns):
            return await spooled()
        arena = await self._through_arena(topic) if columns else None
        of = None if patch is None else patch.global_indexes
        if arena is not None:
            plain = batches.other_rows(other, n, topic.kinds)
            wait = LEASE_TIMEOUT_S if timeout is None else timeout
            spill = self._handle.zerocopy_mode != "force" and pieces.spoolable(columns)
            try:
                blob = codec.pack(plain.rows)
                for attempt_wait in (min(wait, SPILL_AFTER_SECONDS), wait - SPILL_AFTER_SECONDS) if spill else (wait,):
                    try:
                        sealed = await arena.put_tensors(
                            columns, plain, blob, n, partition, attempt_wait, of, key,
                            dedup_bytes=dedup_bytes, lease_ahead=lease_ahead,
                        )  # fmt: skip
                        break
                    except MemoryFull:
                        if not spill or attempt_wait <= 0:
                            raise
                        with contextlib.suppress(ConfigError):  # a topic in an object store has no spool folder
                            return await spooled()
                        spill = False  # then wait on for the rest of the timeout
                first, n = topic.stored(*sealed[:3])
                self._handle.moved("put_zero_copy_bytes", payload)
                return batches.batch_meta(first, n, partition, columns, other, patch)
            except ConfigError as exc:
                if not self._copy_instead(exc):
                    raise
        return await self._put_copied(topic, columns, other, n, partition, patch, key, dedup_bytes)

    async def _through_arena(self, topic: TopicAPI) -> ArenaClient | None:
        """The topic's arena if a tensor batch goes through it (put and reserve decide alike), else None;
        ``"force"`` refuses where it cannot."""
        mode = self._handle.zerocopy_mode
        arena = topic.arena
        if arena is None:  # no shared memory at all (embedded mode)
            if mode == "force":
                raise ConfigError(
                    "zerocopy_mode='force' needs broker mode (shared memory between processes); embedded mode copies"
                )
        elif mode != "off":
            if await arena.has_arena():
                return arena
            if mode == "force":
                raise ConfigError("zerocopy_mode='force': the broker runs without an arena (--arena-bytes)")
        return None

    def _copy_instead(self, exc: ConfigError) -> bool:
        """A batch larger than the arena is copied over the socket, unless ``"force"`` refuses that."""
        return self._handle.zerocopy_mode != "force" and "larger than the arena" in str(exc)

    async def _put_copied(
        self,
        topic: TopicAPI,
        columns: Mapping[str, tensors.AnyColumn],
        other: dict[str, list[Any]],
        n: int,
        partition: str,
        patch: BatchMeta | None,
        key: str | None,
        dedup_bytes: tuple[int, int] | None = None,
    ) -> BatchMeta:
        """The copy path: every sample encoded into a row, stored like records."""
        batch = await asyncio.to_thread(batches.full_rows, columns, other, n, topic.kinds)
        blob = await asyncio.to_thread(codec.pack, batch.rows)
        of = None if patch is None else patch.global_indexes
        first, n = await topic.append(batch, partition, blob, key, of=of, dedup_bytes=dedup_bytes)
        self._handle.moved("put_copied_bytes", sum(col.nbytes for col in columns.values()))
        return batches.batch_meta(first, n, partition, columns, other, patch)

    async def reserve(self, spec: Any, batch_size: Any, partition_id: Any, timeout: Any) -> Reservation:
        n = reservation.check_batch_size(batch_size)
        codec.check_partition(partition_id)
        if timeout is not None and (not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0):
            raise ConfigError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        topic = await self._handle.engine()
        fields = reservation.parse_spec(spec, topic.kinds)
        r = None
        if n == 0:  # as put of an empty batch: nothing to lease, nothing stored
            pass
        elif (arena := await self._through_arena(topic)) is not None:
            wait = LEASE_TIMEOUT_S if timeout is None else float(timeout)
            try:
                r = await reservation.in_arena(self._owner, arena, fields, n, partition_id, wait)
            except ConfigError as exc:
                if not self._copy_instead(exc):
                    raise
        if r is None:
            r = reservation.plain(self._owner, fields, n, partition_id)
        self._reservations.add(r)
        return r

    async def put_reserved(
        self,
        r: Reservation,
        partition_id: str | None,
        patch: BatchMeta | None,
        timeout: float | None,
        extra: Any,
        key: str | None = None,
    ) -> BatchMeta:
        # Bad arguments are refused before the reservation is touched: it stays open for a corrected put.
        r._check_put(self._owner)
        if partition_id is not None and partition_id != r.partition_id:
            raise ConfigError(f"this reservation is for partition {r.partition_id!r}, not {partition_id!r}")
        if patch is not None:
            check_patch(patch, r.partition_id)
            if patch.size != r.batch_size:
                raise ConfigError(f"the reservation holds {r.batch_size} samples but batch_meta names {patch.size}")
        other = reservation.check_extra(extra, r._fields, r.batch_size)
        topic = await self._handle.engine()
        other = objects.prepare(other, set(), self._handle.objects, topic.kinds, _storable)
        plain = batches.other_rows(other, r.batch_size, topic.kinds)  # refuses bad values now, not in the store
        r._begin_put(self._owner)
        try:
            columns = r._columns()
            if r.batch_size == 0:
                meta = patch if patch is not None else BatchMeta()
            elif r._lease is not None and r._places is not None and (arena := topic.arena) is not None:
                wait = LEASE_TIMEOUT_S if timeout is None else timeout  # only if the broker restarted meanwhile
                of = None if patch is None else patch.global_indexes
                args = (r._lease, r._places, plain, codec.pack(plain.rows), r.batch_size, r.partition_id, wait, of, key)
                first, n = topic.stored(*await arena.put_reserved(*args))
                self._handle.moved("put_zero_copy_bytes", r.nbytes)
                meta = batches.batch_meta(first, n, r.partition_id, columns, other, patch)
            else:
                meta = await self._put_copied(topic, columns, other, r.batch_size, r.partition_id, patch, key)
        except BaseException as exc:
            r._put_failed(exc)
            raise
        r._put_done(meta)
        return meta


def check_patch(meta: Any, partition: str) -> None:
    if not isinstance(meta, BatchMeta):
        raise ConfigError(f"batch_meta must be the BatchMeta of the samples, got {type(meta).__qualname__}")
    if any(s.partition_id != partition for s in meta.samples):
        raise ConfigError(f"batch_meta holds samples of {meta.partition_ids}, not of {partition!r}")


def _storable(name: str, value: Any) -> bool:
    """Whether the record codec stores ``value`` (else, with objects="pickle", the field is pickled)."""
    try:
        codec.encode_value(value, codec.kind_of(value, name), name)
    except InvalidRecordError:
        return False
    return True


def one_partition(meta: BatchMeta) -> str:
    """The one partition of ``meta``'s samples (a put with ``batch_meta`` and no ``partition_id`` goes there)."""
    parts = meta.partition_ids
    if len(parts) > 1:
        raise ConfigError(f"batch_meta holds samples of several partitions {parts}; put to each one separately")
    return parts[0] if parts else "default"
