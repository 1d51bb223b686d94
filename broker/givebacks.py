"""What clients give back to the arena beside their requests: holds whose views died and leases they will not
put, riding along on their next request (no round trip each) or sent on their own (``release``).

``released``: [[arena generation, hold ids, extent ids to abandon], ...] (persisting/client/releases.py); the
older ``release`` (hold ids) and ``abandon`` (extent ids, with the request's ``generation``) are still taken.
Their shapes are checked by the request's struct (wire/requests.py ``GivebackArgs``); the dispatch applies them
before the request's handler runs (broker/requests/table.py). Everything given back is the sender's only: the
process the kernel names (``peers.py``); a connection without one gives back nothing, as it holds nothing.
"""

from __future__ import annotations

from persisting.tensors.arena import Arena, Peer
from persisting.wire.requests import GivebackArgs

from .extents import Extents


def same_arena(args: GivebackArgs, arena: Arena | None) -> bool:
    """Whether the extents a request names come from this broker's arena (``generation``, when the client sends
    it): ids start again at 1 after a restart, so an old id may name an extent the same client leased anew."""
    return args.generation is None or (arena is not None and args.generation == arena.generation)


def apply(args: GivebackArgs, extents: Extents, arena: Arena | None, peer: Peer | None) -> None:
    """Give back what rides on a request: entries of another generation name ids of a broker before a restart
    and are ignored."""
    if peer is None:
        return
    for entry in args.released or ():
        if arena is None or entry.generation != arena.generation:
            continue
        for hold in entry.holds:
            extents.release(hold, peer)
        _abandon(extents, entry.extents, peer)
    for hold in args.release or ():
        extents.release(hold, peer)
    if args.abandon and same_arena(args, arena):  # else extents of an arena before a restart: never leased here
        _abandon(extents, args.abandon, peer)


def _abandon(extents: Extents, ids: list[int], peer: Peer) -> None:
    """Leases ``peer`` will not put, given back; anyone else's extent, or a sealed one, is left alone."""
    for extent_id in ids:
        ext = extents.extents.get(extent_id)
        if ext is not None and not ext.sealed and ext.owner == peer:
            extents.abandon(ext)
