"""Requests a client sent more than once: answered once.

A client re-sends a request that has had no reply for a while (``remote.RESEND_SECONDS`` after its hold), and
again when it reconnects. To a broker that is still running, that copy is the same request: it must not run a
second time, or a second ``take`` would hand out (and lose) another batch, a second ``lease`` pin another
extent, a second ``get_data`` leave holds nobody releases. Requests are named by (the client connection's
ROUTER identity, its request id): ids count up per connection, and a connection that comes back gets a new
identity, so a name is never reused.

- A copy that arrives while the first is running is dropped: the first one's reply answers both.
- A copy that arrives after the reply went out gets that reply again, from a bounded cache of recent replies
  (by count and bytes; a reply over ``REPLY_CACHE_ONE_BYTES`` is not kept, so a copy of such a request after
  its answer runs again).

A restarted broker starts with both empty: it never saw the requests, and runs them.
"""

from __future__ import annotations

from collections import OrderedDict

REPLY_CACHE_ENTRIES = 4096
REPLY_CACHE_BYTES = 64 * 1024 * 1024
REPLY_CACHE_ONE_BYTES = 4 * 1024 * 1024

Name = tuple[bytes, int]  # (ROUTER identity of the client connection, request id)


class RecentRequests:
    def __init__(self) -> None:
        self._running: set[Name] = set()
        self._replies: OrderedDict[Name, tuple[list[bytes], int]] = OrderedDict()  # the frames, their bytes
        self._bytes = 0

    def answered(self, name: Name) -> list[bytes] | None:
        """The reply frames (without the identity) a request got already, if it is a copy of one answered."""
        found = self._replies.get(name)
        return None if found is None else found[0]

    def start(self, name: Name) -> bool:
        """Whether to run a request now: False for a copy of one still running (drop it; that one answers)."""
        if name in self._running:
            return False
        self._running.add(name)
        return True

    def done(self, name: Name, frames: list[bytes]) -> None:
        """The request ran and these are its reply frames (without the identity)."""
        self._running.discard(name)
        size = len(frames[0]) if len(frames) == 1 else sum(len(f) for f in frames)  # most replies: one frame
        if size > REPLY_CACHE_ONE_BYTES:
            return
        self._replies[name] = (frames, size)
        self._bytes += size
        while len(self._replies) > REPLY_CACHE_ENTRIES or self._bytes > REPLY_CACHE_BYTES:
            self._bytes -= self._replies.popitem(last=False)[1][1]

    def abandon(self, name: Name) -> None:
        """The request will not answer (the broker is stopping): a copy may run."""
        self._running.discard(name)
