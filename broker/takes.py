"""The ``take`` request: samples handed to a task (``get_meta``), and with ``fields`` their data too
(``get_batch``, one round trip; with ``describe`` false and one sample, its rows without field descriptions).

The broker's busiest request after a put, so it has its own path: ``Broker._dispatch`` sends it here before the
general chain of operations, and its arguments are checked in one pass (``protocol.arg`` for the required ones; a
``bool`` is refused where a number is due, as everywhere on the wire). A bad argument gets the same
``ProtocolError``/``ConfigError`` reply it got through the general path. A ``note`` rides along: records of
the samples taken, appended before the reply (broker/riders.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from persisting.engine import Topic, sampler_from_wire
from persisting.errors import ConfigError, ProtocolError
from persisting.wire import protocol
from persisting.wire.protocol import Reply, Request, arg

from . import givebacks, peers, riders, spooling

if TYPE_CHECKING:
    from .extents import Peer
    from .plane import TensorPlane

TAKE_READ_ATTEMPTS = 4  # get_batch reads again when a clear of its samples landed meanwhile (see take)
_NUMBER = (int, float)
_SAMPLER_KW = frozenset({"dp_rank", "batch_index"})


def _seconds(value: Any) -> bool:
    """Whether ``value`` is a number of seconds from the wire (an int or a float, not a bool)."""
    return type(value) in _NUMBER


async def take(plane: TensorPlane, req: Request, topic: Topic, peer: Peer | None) -> Reply:
    """Answer a ``take``: the samples the sampler picks, logged (or leased) before this returns, with their field
    descriptions; ``fields`` (get_batch): their data in the same reply."""
    args = req.args
    if plane.extents is not None:
        givebacks.apply(req, plane.extents, plane.arena, peer)  # holds released since, riding along
    partition, task = arg(req, "partition", str), arg(req, "task", str)
    batch_size = arg(req, "batch_size", int)
    if batch_size < 0:
        raise ConfigError(f"batch_size must be >= 0, got {batch_size}")
    wait = args.get("wait", 0.0)
    if not _seconds(wait) or wait < 0:
        raise ProtocolError("take wait must be a number of seconds >= 0")
    sampler = sampler_from_wire(args.get("sampler"))
    kw = args.get("sampler_kw") or {}
    if type(kw) is not dict or (kw and not _SAMPLER_KW.issuperset(kw)):
        raise ProtocolError("take sampler_kw may hold dp_rank and batch_index only")
    limit = min(float(wait), protocol.WAIT_SLICE_SECONDS)
    seconds = args.get("lease_seconds")
    if seconds is not None and (not _seconds(seconds) or seconds <= 0):
        raise ProtocolError("take lease_seconds must be a number > 0 or nil")
    lease = None if seconds is None else (float(seconds), peer or peers.claimed(req))
    need = args.get("ready_fields", args.get("fields"))  # get_batch: the fields it reads
    if need is not None and (type(need) is not list or not all(type(f) is str for f in need)):
        raise ProtocolError("take ready_fields must be a list of str or nil")
    request_key = args.get("key")
    if request_key is not None and type(request_key) is not str:
        raise ProtocolError("take key must be a str or nil")
    note = riders.note_of(req)
    skip_describe = args.get("describe", True) is False and "fields" in args
    indexes = await topic.take(
        partition, task, batch_size, limit, sampler, lease, fields=need, request_key=request_key, **kw
    )
    # A re-sent take's batch may have been cleared since, and a clear may land while this reads (each
    # await lets other requests run): the answer holds the samples still there once it is read.
    for attempt in range(TAKE_READ_ATTEMPTS):
        indexes = topic.not_cleared(indexes)
        # ``describe: false`` (the persist-queue layer's get of one record reads its rows only): no descriptions,
        # which read each row once more; a batch of several is still described, its size is judged by them.
        described = [] if skip_describe and len(indexes) <= 1 else await topic.describe(indexes, lenient=True)
        if "fields" not in args:
            return Reply(req.id, True, [indexes, described, *await _noted(req, topic, note, indexes)])
        # get_batch: the data of the samples just taken, in the same reply (one round trip).
        too_big = spooling.too_big(indexes, described, args["fields"], plane.size_bytes)
        try:
            # too big for one reply of copies: views if the samples lie in shared memory, else read in pieces
            data = await plane.get(req, topic, peer, indexes, views_only=too_big)
            if isinstance(data.result, dict) and data.result.get("later"):
                return Reply(req.id, True, [indexes, described, data.result, *await _noted(req, topic, note, indexes)])
        except ConfigError:
            if topic.not_cleared(indexes) == indexes or attempt == TAKE_READ_ATTEMPTS - 1:
                raise  # not a clear that came meanwhile
            continue
        if topic.not_cleared(indexes) == indexes:
            noted = await _noted(req, topic, note, indexes)
            return Reply(req.id, True, [indexes, described, data.result, *noted], buffers=data.buffers)
        plane.drop_hold(data, peer)
    raise ConfigError(f"the samples taken kept being cleared while their data was read ({indexes[:10]})")


async def _noted(
    req: Request, topic: Topic, note: tuple[str, str, dict[str, Any]] | None, indexes: list[int]
) -> list[Any]:
    """The reply's last element for a take with a ``note`` (broker/riders.py), written now; none without one."""
    return [] if note is None else [await riders.write_note(req, topic, note, indexes)]
