"""Tensor batches larger than the arena, the broker's side: a spool file per batch (``persisting.engine``'s
``spooled.py`` holds the file's life; docs/concepts/batch-sizes.md the path each size takes).

    spool_begin  {topic, config, pid}                     -> [name, path of a fresh part file the caller writes]
    spool_where  {topic, config, indexes, fields}         -> {dir, runs} or None: where a get's dense fields lie in
                 spool files (a client the kernel names only: it reads the files itself; tcp clients get None)
    put_spooled  {topic, config, partition, count, kinds, key, name, fields[, of]} + 1 buffer (the non-tensor
                 rows) -> [first, count], once logged, synced and flushed (the file is then deleted)

The producer writes the tensors into the part file itself (same node, the service's group): nothing of the
payload crosses the socket or the arena. Each ``spool_begin`` sweeps part files whose writer is dead.
"""

from __future__ import annotations

from typing import Any

from persisting.engine import Topic, new_spool_part, put_spooled, spool_where, sweep_spool
from persisting.errors import ConfigError, ProtocolError
from persisting.tensors import pieces
from persisting.wire.protocol import Reply
from persisting.wire.replies import Range, SpoolPart
from persisting.wire.requests import PutSpooled, SpoolBegin, SpoolWhere

from .context import Call, Services
from .records import encoded_rows


def _local(call: Call[Any]) -> Topic:
    topic = call.topic
    if not isinstance(topic, Topic):
        raise ConfigError("batches larger than the arena need a topic on local disk (the spool file lies beside it)")
    return topic


async def spool_begin(services: Services, call: Call[SpoolBegin]) -> Reply:
    topic = _local(call)
    pid = call.peer[0] if call.peer is not None else call.args.pid  # the kernel's word first
    if pid is None:
        raise ProtocolError("spool_begin needs argument 'pid' (an int) where the kernel does not name the process")
    sweep_spool(topic.path, None)
    name, path = new_spool_part(topic.path, int(pid))
    return call.ok(SpoolPart(name, str(path)))


async def spool_where_(services: Services, call: Call[SpoolWhere]) -> Reply:
    topic = _local(call)
    if call.peer is None:  # a tcp client (or no kernel credentials): it may not be on this node, reads copies
        return call.ok(None)
    return call.ok(await spool_where(topic, call.args.indexes, call.args.fields))


async def put_spooled_(services: Services, call: Call[PutSpooled]) -> Reply:
    args, topic = call.args, _local(call)
    if args.key is not None:
        done = await topic.recall(args.key)  # a re-sent put whose first attempt stored the batch
        if done is not None:
            return call.ok(Range(*done))
    batch = encoded_rows(call.buffers, args.kinds, args.count, "put_spooled")
    first, n = await put_spooled(
        topic, batch, args.partition, call.buffers[0], args.key, args.name, args.fields, args.of
    )
    return call.ok(Range(first, n))


def too_big(indexes: list[int], described: list[list[Any]], fields: list[str], arena_bytes: int | None) -> bool:
    """Whether a get_batch's data is larger than the arena takes: then its reply carries the meta only and the
    client asks for the data in pieces (``tensors/pieces.py``), so no reply holds more than a piece."""
    if len(indexes) <= 1:
        return False
    # Sized per run from the descriptions: a meta per sample (meta_from) cost ~1/5 of the broker's time per
    # get_batch in `bench arena`.
    covered = sum(int(run[0]) for run in described)
    if covered != len(indexes):
        raise ProtocolError(f"field descriptions cover {covered} samples, not {len(indexes)}")
    return pieces.described_bytes(described, fields) > pieces.spool_above(arena_bytes)
