"""The ``take`` request: samples handed to a task (``get_meta``), and with ``fields`` their data too
(``get_batch``, one round trip; with ``describe`` false and one sample, its rows without field descriptions).

The broker's busiest request after a put. Its arguments come typed (wire/requests.py ``Take``: a ``bool`` is
refused where a number is due, a negative wait too); what the struct cannot say is checked here. A ``note``
rides along: records of the samples taken, appended before the reply (riders.py).
"""

from __future__ import annotations

from persisting.engine import Topic, sampler_from_wire
from persisting.errors import ConfigError, ProtocolError
from persisting.wire import protocol
from persisting.wire.protocol import Reply
from persisting.wire.replies import Later, Range, Taken, TakenNoted, TakenWithData, TakenWithDataNoted
from persisting.wire.requests import Take

from .. import peers
from . import reads, riders, spool
from .context import Call, Services

TAKE_READ_ATTEMPTS = 4  # get_batch reads again when a clear of its samples landed meanwhile (see take)
_SAMPLER_KW = frozenset({"dp_rank", "batch_index"})


async def take(services: Services, call: Call[Take]) -> Reply:
    """Answer a ``take``: the samples the sampler picks, logged (or leased) before this returns, with their field
    descriptions; ``fields`` (get_batch): their data in the same reply."""
    args, topic, peer = call.args, call.topic, call.peer
    if args.batch_size < 0:
        raise ConfigError(f"batch_size must be >= 0, got {args.batch_size}")
    sampler = sampler_from_wire(args.sampler)
    kw = args.sampler_kw or {}
    if kw and not _SAMPLER_KW.issuperset(kw):
        raise ProtocolError("take sampler_kw may hold dp_rank and batch_index only")
    limit = min(args.wait, protocol.WAIT_SLICE_SECONDS)
    seconds = args.lease_seconds
    lease = None if seconds is None else (seconds, peer or peers.claimed(call.op, args.peer))
    need = args.ready_fields if args.ready_fields is not None else args.fields  # get_batch: the fields it reads
    note = riders.note_of(args.note)
    fields = args.fields
    skip_describe = not args.describe and fields is not None
    indexes = await topic.take(
        args.partition, args.task, args.batch_size, limit, sampler, lease, fields=need, request_key=args.key, **kw
    )
    # A re-sent take's batch may have been cleared since, and a clear may land while this reads (each
    # await lets other requests run): the answer holds the samples still there once it is read.
    memory = services.memory
    for attempt in range(TAKE_READ_ATTEMPTS):
        indexes = topic.not_cleared(indexes)
        # ``describe: false`` (the persist-queue layer's get of one record reads its rows only): no descriptions,
        # which read each row once more; a batch of several is still described, its size is judged by them.
        described = [] if skip_describe and len(indexes) <= 1 else await topic.describe(indexes, lenient=True)
        if fields is None:
            if note is None:
                return call.ok(Taken(indexes, described))
            return call.ok(TakenNoted(indexes, described, await _noted(call, topic, note, indexes)))
        # get_batch: the data of the samples just taken, in the same reply (one round trip).
        too_big = spool.too_big(indexes, described, fields, memory.size_bytes)
        try:
            # too big for one reply of copies: views if the samples lie in shared memory, else read in pieces
            data, buffers = await reads.data(
                memory,
                topic,
                peer,
                indexes,
                fields,
                zerocopy=args.zerocopy,
                columns_wanted=args.columns,
                views_only=too_big,
                checked=True,
            )
        except ConfigError:
            if topic.not_cleared(indexes) == indexes or attempt == TAKE_READ_ATTEMPTS - 1:
                raise  # not a clear that came meanwhile
            continue
        if isinstance(data, Later) or topic.not_cleared(indexes) == indexes:
            if note is None:
                return call.ok(TakenWithData(indexes, described, data), buffers)
            noted = await _noted(call, topic, note, indexes)
            return call.ok(TakenWithDataNoted(indexes, described, data, noted), buffers)
        reads.drop_hold(memory, data, peer)
    raise ConfigError(f"the samples taken kept being cleared while their data was read ({indexes[:10]})")


async def _noted(call: Call[Take], topic: Topic, note: riders.Noted, indexes: list[int]) -> Range | None:
    """The records of a take's ``note`` (riders.py), written now: where they went, None if nothing was taken."""
    return await riders.write_note(call.args.key, topic, note, indexes)
