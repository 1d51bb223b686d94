"""The arena's requests: ``lease`` an extent, ``put_tensors`` the batch a producer wrote there, ``release`` holds
and leases (broker/givebacks.py gives back what rides along on every one of them, before it runs).

A producer leases an extent, writes its batch there itself (the only copy a tensor gets), and sends
``put_tensors`` with the layout; the broker checks the layout against the lease, logs a reference (not the bytes)
and makes the samples visible (broker/tensor_memory.py: the arena's life, its restarts).
"""

from __future__ import annotations

import math
from typing import Any

from persisting.engine import ArenaPayload, Topic
from persisting.errors import ConfigError, InvalidRecordError, ProtocolError, UnknownExtentError
from persisting.tensors import column as tensors
from persisting.tensors import jagged
from persisting.tensors.arena import FIELD_ALIGN_BYTES, Arena, Peer
from persisting.wire import codec
from persisting.wire.protocol import Reply
from persisting.wire.replies import Extent, KeyedTensorRange, Range, RangeLeased
from persisting.wire.requests import JaggedField, Lease, PutTensors, Release, tensor_field

from .. import givebacks, peers
from ..extents import Extents
from ..tensor_memory import MAX_LEASE_WAIT_SECONDS, TensorMemory
from . import kv
from .context import Call, Services
from .records import encoded_rows


def _arena(memory: TensorMemory) -> tuple[Arena, Extents]:
    if memory.arena is None or memory.extents is None:
        raise ConfigError("this broker runs without an arena (--arena-bytes 0): tensor batches go over the socket")
    return memory.arena, memory.extents


async def lease(services: Services, call: Call[Lease]) -> Reply:
    arena, extents = _arena(services.memory)
    owner = peers.arena_peer(call.op, call.peer)
    ext = await extents.lease(call.args.nbytes, owner, min(call.args.timeout, MAX_LEASE_WAIT_SECONDS))
    return call.ok(Extent(ext.id, ext.offset, ext.nbytes, arena.generation))


async def release(services: Services, call: Call[Release]) -> Reply:
    extents = _arena(services.memory)[1]
    hold, peer = call.args.hold, call.peer
    return call.ok(hold is not None and peer is not None and extents.release(hold, peer))


async def put_tensors(services: Services, call: Call[PutTensors]) -> Reply:
    memory = services.memory
    arena, extents = _arena(memory)
    return call.ok(*await _put(call, call.topic, memory, arena, extents, peers.arena_peer(call.op, call.peer)))


async def _put(
    call: Call[PutTensors], topic: Topic, memory: TensorMemory, arena: Arena, extents: Extents, peer: Peer
) -> tuple[Any, list[bytes]]:
    args = call.args
    key = args.key
    if key is not None:
        # A re-sent put (its first attempt sealed the extent, maybe still waiting for its sync): same answer.
        done = await topic.recall(key)
        if done is not None:
            memory.retried.recalled(key, args.extent, givebacks.same_arena(args, arena), extents, peer)
            if args.kv is None:
                return Range(*done), []
            samples, described = await kv.recalled(topic, args.kv, args.partition)
            return KeyedTensorRange(*done, None, samples, described), []
    if not givebacks.same_arena(args, arena):
        raise UnknownExtentError(f"extent {args.extent!r} was leased from an arena before a restart")
    ext = extents.leased(args.extent, peer)
    try:
        count, partition, kinds = args.count, args.partition, args.kinds
        batch = encoded_rows(call.buffers, kinds, count, "put_tensors")
        columns: dict[str, tensors.AnyColumn] = {}
        ref_fields = []
        for entry in args.fields:
            field = tensor_field(entry)
            name = field.name
            if not name or name.startswith(codec.RESERVED_PREFIX) or name in kinds or name in columns:
                raise InvalidRecordError(f"invalid or repeated tensor field name {name!r}")
            if isinstance(field, JaggedField):  # values + offsets (tensors/jagged.py)
                if field.kind != jagged.KIND:
                    raise ProtocolError(f"field {name!r}: eight values describe a jagged field, not {field.kind!r}")
                columns[name] = jagged.from_arena(list(entry), count, arena.view, ext.nbytes, ext.offset)
                ref_fields.append(list(entry))
                continue
            dtype = tensors.storage_dtype(field.kind, field.dtype)
            shape, offset, nbytes = field.shape, field.offset, field.nbytes
            want = count * math.prod(shape) * dtype.itemsize  # Python ints: no int64 wrap-around
            if offset % FIELD_ALIGN_BYTES or nbytes != want:
                raise ProtocolError(f"field {name!r}: {nbytes!r} bytes at {offset!r} do not fit {count}x{shape}")
            if offset < 0 or offset + nbytes > ext.nbytes:
                raise ProtocolError(f"field {name!r} lies outside its extent ({ext.nbytes} bytes)")
            view = arena.view(ext.offset + offset, nbytes).view(dtype).reshape((count, *shape))
            columns[name] = tensors.Column(field.kind, field.dtype, view)
            ref_fields.append([name, field.kind, field.dtype, shape, offset, nbytes])
        all_kinds = {**kinds, **{name: col.kind for name, col in columns.items()}}
        ref = {"gen": arena.generation, "offset": ext.offset, "fields": ref_fields}
        payload = ArenaPayload(ext.id, ref, columns)
        # Sealed before the await: the reaper must not free it if the producer dies while we log it.
        extents.seal(ext, topic.name, 2**62)
        batch = codec.EncodedBatch(batch.rows, all_kinds)
        if args.kv is not None:  # a keyed put (Queue.kv_put): the engine's key index decides new samples or a patch
            first, n, keyed = await kv.put(topic, args.kv, batch, partition, call.buffers[0], key, payload)
        else:
            first, n = await topic.append(batch, partition, call.buffers[0], key, arena=payload, of=args.of)
            keyed = None
    except BaseException:
        extents.abandon(ext)
        raise
    if not payload.used:
        # A retried put (its key was stored by the first attempt) or an empty batch: no row points here.
        extents.abandon(ext)
    else:
        extents.seal(ext, topic.name, first + n - 1)
        if first + n <= topic.flushed_upto:  # flushed while it was logged (on_flushed saw it unsealed)
            extents.persisted(topic.name, topic.flushed_upto)
        if extents.unpersisted_bytes() > memory.flush_at(ext.offset):
            topic.flush_soon()  # before producers have to wait for space
    nxt, spare_extent = args.lease_next, None
    if nxt is not None and nxt > 0:
        # The producer's next extent, if one is free now (never waits): its next put skips the lease request.
        spare = extents.try_lease(nxt, peer)
        if spare is not None:
            memory.retried.leased_ahead(key, spare.id)
            spare_extent = Extent(spare.id, spare.offset, spare.nbytes, arena.generation)
    if keyed is not None:
        return KeyedTensorRange(first, n, spare_extent, *keyed), []
    return (Range(first, n) if spare_extent is None else RangeLeased(first, n, spare_extent)), []
