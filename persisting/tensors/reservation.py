"""Reservations: a tensor batch the producer writes in place, then puts without a copy.

``Queue.reserve(spec, batch_size, partition_id)`` returns a ``Reservation``: one writable array per field of
``spec`` (``{name: (sample_shape, dtype)}``), shaped ``(batch_size, *sample_shape)``; a numpy dtype gives a numpy
array, a torch dtype a torch tensor over the same memory (bfloat16 as int16 bytes viewed as bfloat16, as
``tensors/dtypes.py`` stores it). The producer fills them (a GPU->host copy straight into them, say) and
``put(reservation)`` stores the batch, returning the same ``BatchMeta`` as ``put(data, partition_id)``.

Where the bytes live:

- Broker mode with an arena (``zerocopy_mode`` "auto" or "force"): in an extent of the broker's shared memory
  leased for this batch by this process (pid and start time, like a put's lease), laid out as a put lays it out
  (each field on a 64-byte boundary). ``put`` seals the extent with one request and copies nothing: the
  producer's own write was the only one. A producer that dies holding a reservation has its extent freed by the
  broker's reaper within about a second; nothing of it becomes visible.
- Everywhere else (embedded mode, ``zerocopy_mode="off"``, a broker without an arena, a batch larger than the
  arena in "auto"): plain process memory; ``put`` stores it like any tensor batch (a copy). "force" refuses what
  cannot be zero-copy with ``ConfigError``, as ``put`` does.

The arrays start with undefined contents (like ``np.empty``; in the arena, bytes of an earlier batch). A
reservation ends once: put, or abandoned (``abandon()``, leaving its ``async with`` block without a put, its
queue's close, or a put that failed after it reached the store). After that its arrays belong to the queue (or,
abandoned, to the next batch that leases the space): the reservation's numpy arrays are made read-only and
``data`` raises ``ConfigError``; views made from them earlier and the torch tensors cannot be locked, so they
must not be used any more. Reservation arrays garbage-collected without a put or an abandon give their extent
back once the last of them is gone.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Coroutine, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InvalidRecordError, SchemaConflictError
from ..wire import codec
from . import column as tensors
from .arena import FIELD_ALIGN_BYTES, align_up
from .meta import BatchMeta

if TYPE_CHECKING:
    import numpy as np

    from ..client.remote_tensors import ArenaClient, ReservedExtent
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of a reservation, checked."""

    name: str
    kind: str  # "ndarray" (a numpy dtype was given) or "tensor" (a torch dtype)
    dtype_name: str  # numpy dtype str, or torch dtype name: as tensors.Column names them
    storage: np.dtype[Any]  # the numpy dtype holding the bytes (bfloat16: int16)
    sample_shape: tuple[int, ...]

    def nbytes(self, batch_size: int) -> int:
        return batch_size * math.prod(self.sample_shape) * self.storage.itemsize


def parse_spec(spec: Any, known_kinds: Mapping[str, str]) -> list[FieldSpec]:
    """The fields of ``spec`` (``{name: (sample_shape, dtype)}``), refused with ``InvalidRecordError`` naming the
    field and what is wrong; a field stored before as the other kind (numpy vs torch) is a ``SchemaConflictError``
    now rather than at put time."""
    if not isinstance(spec, Mapping) or not spec:
        raise InvalidRecordError(
            "reserve() takes a non-empty dict {field: (sample_shape, dtype)}, e.g. "
            f"{{'obs': ((4096,), np.float32)}}; got {spec!r:.200}"
        )
    out = []
    for name, entry in spec.items():
        if not isinstance(name, str) or not name:
            raise InvalidRecordError(f"reservation field names must be non-empty str, got {name!r}")
        codec.check_names("reservation field", [name])
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            raise InvalidRecordError(
                f"field {name!r}: the spec gives (sample_shape, dtype), e.g. ((4096,), np.float32) or "
                f"((), torch.bfloat16); got {entry!r:.200}"
            )
        shape, dtype = entry
        kind, dtype_name, storage = _dtype(name, dtype)
        field = FieldSpec(name, kind, dtype_name, storage, _shape(name, shape))
        stored = known_kinds.get(name)
        if stored is not None and stored != kind:
            raise SchemaConflictError(name, stored, kind)
        out.append(field)
    return out


def _dtype(name: str, dtype: Any) -> tuple[str, str, np.dtype[Any]]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        dtype_name = str(dtype).removeprefix("torch.")
        if dtype_name not in tensors.TORCH_DTYPES:
            supported = sorted(tensors.TORCH_DTYPES)
            raise InvalidRecordError(f"field {name!r}: torch dtype {dtype_name!r} is not supported ({supported})")
        return "tensor", dtype_name, tensors.storage_dtype("tensor", dtype_name)
    if dtype is None:  # np.dtype(None) would be float64: an omission must not pick a dtype
        raise InvalidRecordError(f"field {name!r}: no dtype; give one, e.g. np.float32, 'int64' or torch.bfloat16")
    try:
        np_dtype = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        hint = " (bfloat16 has no numpy dtype: pass torch.bfloat16)" if "bfloat16" in str(dtype) else ""
        raise InvalidRecordError(f"field {name!r}: {dtype!r} is not a dtype{hint}") from exc
    try:
        tensors.storage_dtype("ndarray", np_dtype.str)
    except InvalidRecordError as exc:
        raise InvalidRecordError(f"field {name!r}: {exc}") from None
    return "ndarray", np_dtype.str, np_dtype


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, tuple | list) or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidRecordError(
            f"field {name!r}: the sample shape must be a tuple of ints >= 0 (() for one value per sample), "
            f"got {shape!r:.200}"
        )
    return tuple(int(d) for d in shape)


def check_batch_size(batch_size: Any) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 0:
        raise ConfigError(f"batch_size must be an int >= 0 (samples in the reservation), got {batch_size!r}")
    return batch_size


def layout(fields: list[FieldSpec], batch_size: int) -> tuple[list[int], int]:
    """Each field's offset in the extent (FIELD_ALIGN_BYTES-aligned, as ``batches.layout``), and the bytes used."""
    offsets = []
    cursor = 0
    for f in fields:
        offset = align_up(cursor, FIELD_ALIGN_BYTES)
        offsets.append(offset)
        cursor = offset + f.nbytes(batch_size)
    return offsets, cursor


def check_extra(extra: Any, fields: list[FieldSpec], batch_size: int) -> dict[str, list[Any]]:
    """``put(reservation, extra=...)``: per-sample values of non-tensor fields (one list entry per sample)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise InvalidRecordError(
            f"extra must be a dict {{field: list of {batch_size} per-sample values}}, got {type(extra).__qualname__}"
        )
    names = {f.name for f in fields}
    out = {}
    for name, values in extra.items():
        if not isinstance(name, str) or not name:
            raise InvalidRecordError(f"extra field names must be non-empty str, got {name!r}")
        codec.check_names("extra field", [name])
        if name in names:
            raise InvalidRecordError(f"extra field {name!r} is also a field of the reservation")
        if not isinstance(values, list | tuple):
            raise InvalidRecordError(
                f"extra field {name!r} holds a {type(values).__qualname__}; give a list with one value per sample "
                "(arrays belong in the reservation's spec)"
            )
        if len(values) != batch_size:
            raise InvalidRecordError(f"extra field {name!r} has {len(values)} values; the reservation has {batch_size}")
        out[name] = list(values)
    return out


class Reservation:
    """A tensor batch reserved with ``Queue.reserve``: fill its arrays, then ``await queue.put(reservation)``.

    ``r["obs"]`` / ``r.data["obs"]``: the writable array (or torch tensor) of a field, ``(batch_size,
    *sample_shape)``. ``in_arena``: the arrays lie in the broker's shared memory (``put`` copies nothing).
    ``state``: "open", "putting", "put" or "abandoned". ``await r.abandon()`` gives the space back (a no-op once put
    or abandoned; returns whether it gave anything back); ``async with`` abandons it on exit unless it was put.
    """

    def __init__(
        self,
        queue: object,
        fields: list[FieldSpec],
        batch_size: int,
        partition_id: str,
        storage: dict[str, np.ndarray],
        places: list[list[Any]] | None = None,
        lease: ReservedExtent | None = None,
        plane: ArenaClient | None = None,
    ) -> None:
        self.batch_size = batch_size
        self.partition_id = partition_id
        self.nbytes = sum(f.nbytes(batch_size) for f in fields)
        self._queue = queue
        self._fields = fields
        self._storage = storage  # name -> array in the storage dtype (what a put stores)
        self._data = {f.name: tensors.to_user(storage[f.name], f.kind, f.dtype_name) for f in fields}
        self._places = places  # the put_tensors layout of the extent (arena reservations)
        self._lease = lease
        self._plane = plane
        self._state = "open"
        self._why = ""  # what ended it, for the error of a later use

    @property
    def in_arena(self) -> bool:
        return self._lease is not None

    @property
    def state(self) -> str:
        return self._state

    @property
    def names(self) -> list[str]:
        return [f.name for f in self._fields]

    @property
    def data(self) -> Mapping[str, Any]:
        """Field -> writable array / torch tensor (a read-only mapping: assign into the arrays, not the keys)."""
        self._check_open("its arrays are not yours any more")
        return types.MappingProxyType(self._data)

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self._fields)

    def keys(self) -> list[str]:
        return self.names

    def __repr__(self) -> str:
        return (
            f"Reservation(partition_id={self.partition_id!r}, batch_size={self.batch_size}, fields={self.names}, "
            f"in_arena={self.in_arena}, state={self._state!r})"
        )

    async def abandon(self) -> bool:
        """Give the reserved space back; nothing of it is stored. A no-op (False) once put or abandoned."""
        if self._state == "putting":
            raise ConfigError("this reservation's put is in progress; it cannot be abandoned now")
        if self._state != "open":
            return False
        await self._give_back("by abandon() or on leaving its async with block")
        return True

    async def __aenter__(self) -> Reservation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._state == "open":
            await self.abandon()

    # -- for Queue ------------------------------------------------------------------------------------------

    def _check_open(self, consequence: str) -> None:
        if self._state == "putting":
            raise ConfigError(f"this reservation's put is in progress: {consequence}")
        if self._state != "open":
            raise ConfigError(f"this reservation was {self._state} ({self._why}): {consequence}; reserve a new one")

    def _check_owner(self, queue: object) -> None:
        if queue is not self._queue:
            raise ConfigError(f"this reservation belongs to {self._queue!r}; put or abandon it through that queue")

    def _check_put(self, queue: object) -> None:
        self._check_owner(queue)
        self._check_open("it cannot be put again")

    def _begin_put(self, queue: object) -> None:
        self._check_put(queue)
        self._state = "putting"

    def _columns(self) -> dict[str, tensors.Column]:
        return {f.name: tensors.Column(f.kind, f.dtype_name, self._storage[f.name]) for f in self._fields}

    def _put_done(self, meta: BatchMeta) -> None:
        if self._lease is not None:
            self._lease.spent = True
        where = f"global indexes {meta.global_indexes[0]}..{meta.global_indexes[-1]}" if meta.size else "no samples"
        self._end("put", f"{where} of partition {self.partition_id!r}")

    def _put_failed(self, exc: BaseException) -> None:
        self._end("abandoned", f"its put failed with {type(exc).__name__}, which gave its space back")
        if self._lease is not None and self._plane is not None:
            self._plane.abandon_reserved_soon(self._lease)

    async def _close(self) -> None:
        """Its queue closes: an open reservation is given back."""
        if self._state == "open":
            await self._give_back("when its queue was closed")

    async def _give_back(self, why: str) -> None:
        # Our arrays stay referenced until the broker has the extent back: their finalizer would otherwise send
        # the same abandon without waiting for it.
        keep = self._storage
        self._end("abandoned", why)
        if self._lease is not None and self._plane is not None:
            await self._plane.abandon_reserved(self._lease)
        del keep

    def _end(self, state: str, why: str) -> None:
        self._state, self._why = state, why
        for arr in (*self._storage.values(), *self._data.values()):
            if isinstance(arr, np.ndarray):
                arr.flags.writeable = False  # a write now would change a stored batch, or a later one's space
        self._storage, self._data = {}, {}


def plain(queue: object, fields: list[FieldSpec], batch_size: int, partition_id: str) -> Reservation:
    """A reservation in process memory (put copies it)."""
    storage = {f.name: np.empty((batch_size, *f.sample_shape), f.storage) for f in fields}
    return Reservation(queue, fields, batch_size, partition_id, storage)


async def in_arena(
    queue: object, plane: ArenaClient, fields: list[FieldSpec], batch_size: int, partition_id: str, timeout: float
) -> Reservation:
    """A reservation in an extent of the broker's arena, leased by this process (raises as a lease does: ``Full``
    after ``timeout``, ``ConfigError`` for a batch larger than the arena)."""
    offsets, total = layout(fields, batch_size)
    lease = await plane.reserve_extent(max(total, 1), timeout)
    try:
        owner = lease.arena.view(lease.base, lease.nbytes, writable=True)
        storage = {}
        places = []
        for f, offset in zip(fields, offsets, strict=True):
            nbytes = f.nbytes(batch_size)
            storage[f.name] = owner[offset : offset + nbytes].view(f.storage).reshape((batch_size, *f.sample_shape))
            places.append([f.name, f.kind, f.dtype_name, list(f.sample_shape), offset, nbytes])
        plane.watch_reserved(owner, lease)
    except BaseException:
        await plane.abandon_reserved(lease)
        raise
    return Reservation(queue, fields, batch_size, partition_id, storage, places, lease, plane)


class Reserving:
    """What ``Queue.reserve`` returns: ``await`` it for the Reservation, or ``async with`` it (the reservation is
    abandoned on leaving the block unless it was put)."""

    def __init__(self, coro: Coroutine[Any, Any, Reservation]) -> None:
        self._coro = coro
        self._reservation: Reservation | None = None

    def __await__(self) -> Generator[Any, None, Reservation]:
        return self._coro.__await__()

    def close(self) -> None:
        """Drop a reservation never awaited (nothing was leased yet)."""
        self._coro.close()

    async def __aenter__(self) -> Reservation:
        self._reservation = await self._coro
        return self._reservation

    async def __aexit__(self, *exc: object) -> None:
        if self._reservation is not None:
            await self._reservation.__aexit__(*exc)
