"""What clients give back to the arena beside their requests: holds whose views died and leases they will not
put, riding along on their next request (no round trip each) or sent on their own (``release``).

``released``: [[arena generation, hold ids, extent ids to abandon], ...] (persisting/client/releases.py); the
older ``release`` (hold ids) and ``abandon`` (extent ids, with the request's ``generation``) are still taken.
Everything given back is the sender's only: the process the kernel names (``peers.py``); a connection without
one gives back nothing, as it holds nothing.
"""

from __future__ import annotations

from typing import Any

from persisting.errors import ProtocolError
from persisting.tensors.arena import Arena, Peer
from persisting.wire.protocol import Request

from .extents import Extents


def same_arena(req: Request, arena: Arena | None) -> bool:
    """Whether the extents a request names come from this broker's arena (``generation``, when the client sends
    it): ids start again at 1 after a restart, so an old id may name an extent the same client leased anew."""
    generation = req.args.get("generation")
    if generation is None:
        return True
    if not isinstance(generation, bytes):
        raise ProtocolError(f"{req.op} generation must be bytes")
    return arena is not None and generation == arena.generation


def int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(x) is int and x >= 0 for x in value):
        raise ProtocolError(f"{what} must be a list of ints >= 0")
    return value


def apply(req: Request, extents: Extents, arena: Arena | None, peer: Peer | None) -> None:
    """Holds a client released since its last request ride along on the next one (no round trip each).

    ``released``: [[arena generation, hold ids, extent ids to abandon], ...] (persisting/client/releases.py);
    entries of another generation name ids of a broker before a restart and are ignored."""
    book = req.args.get("released")
    if book is not None:
        if not isinstance(book, list) or not all(isinstance(e, list) and len(e) == 3 for e in book):
            raise ProtocolError("released must be a list of [generation, hold ids, extent ids]")
        for generation, holds, abandon in book:
            holds, abandon = int_list(holds, "released holds"), int_list(abandon, "released extents")
            if peer is None or arena is None or generation != arena.generation:
                continue
            for hold in holds:
                extents.release(hold, peer)
            for extent_id in abandon:
                ext = extents.extents.get(extent_id)
                if ext is not None and not ext.sealed and ext.owner == peer:
                    extents.abandon(ext)
    released, abandoned = req.args.get("release"), req.args.get("abandon")
    if released and peer is not None:
        for hold in int_list(released, "release"):
            extents.release(hold, peer)
    if abandoned and (peer is None or not same_arena(req, arena)):
        int_list(abandoned, "abandon")  # extents of an arena before a restart: this broker never leased them
    elif abandoned:
        for extent_id in int_list(abandoned, "abandon"):
            ext = extents.extents.get(extent_id)
            if ext is not None and not ext.sealed and ext.owner == peer:
                extents.abandon(ext)
