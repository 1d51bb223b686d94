"""Tensor puts sent again with the key of one already stored (a client's re-send, or a user's retry after
``BrokerUnavailableError``): the extents that copy brought with it go back unused.

A retried ``put_tensors`` names an extent of its own (leased for the retry), and the first attempt's reply, which
the client never got, leased the producer its next extent ahead (``lease_next``): both would stay leased to a
live process that will never seal them. The broker remembers which extent it leased ahead for which key (bounded)
and gives both back when the key's put is recalled.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from persisting.tensors.arena import Peer

from .extents import Extents

AHEAD_KEYS_KEPT = 4096  # keys of recent tensor puts whose lease-ahead extent is remembered


class RetriedPuts:
    def __init__(self) -> None:
        self._ahead: OrderedDict[str, int] = OrderedDict()  # put key -> the extent its reply leased ahead

    def leased_ahead(self, key: Any, extent_id: int) -> None:
        if isinstance(key, str):
            self._ahead[key] = extent_id
            if len(self._ahead) > AHEAD_KEYS_KEPT:
                self._ahead.popitem(last=False)

    def recalled(self, key: str, named: Any, same_arena: bool, extents: Extents, peer: Peer) -> None:
        """The put of ``key`` was stored before: free the extent this copy names (``named``) and the one the
        first attempt leased ahead, where each is still an unsealed lease of ``peer``."""
        ahead = self._ahead.pop(key, None)
        for extent_id in (named if same_arena else None, ahead):
            ext = extents.extents.get(extent_id) if type(extent_id) is int else None
            if ext is not None and not ext.sealed and ext.owner == peer:
                extents.abandon(ext)
