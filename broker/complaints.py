"""Bad input from peers, counted and logged as one line per peer per interval (never one line per frame).

A client that sends garbage, a client of another protocol version, or a fuzzer would otherwise turn each frame
into a log line: 10,000 bad frames were 10,000 lines in journald. Here the first complaint about a peer in an
interval is logged at once (so a person watching sees it within a second), the rest are counted, and when the
interval ends one line per peer says how many came, of which kinds, with the first message as an example. The
number of peers named per interval is capped too (a flood from many connections is one line for the rest).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("persisting.broker")

COMPLAINT_INTERVAL_S = 10.0
MAX_PEERS_NAMED_PER_INTERVAL = 20
# kinds of bad input; also the label values of the persisting_bad_frames_total metric
MALFORMED = "malformed"  # not a message of the protocol at all (not msgpack, no envelope, no id)
VERSION = "version"  # a protocol version this broker does not speak
BAD_REQUEST = "bad_request"  # a well-formed message with an unknown operation or bad arguments
KINDS = (MALFORMED, VERSION, BAD_REQUEST)
MESSAGE_CHARS = 300  # a complaint's message is logged cut to this: a peer's 64 KiB value is not echoed whole


@dataclass(slots=True)
class _PeerTally:
    first: str
    kinds: Counter[str] = field(default_factory=Counter)


class Complaints:
    def __init__(self, interval_s: float = COMPLAINT_INTERVAL_S, on_count: Callable[[str], None] | None = None) -> None:
        self.interval_s = interval_s
        self.totals: Counter[str] = Counter()  # since start, per kind (the status command shows them)
        self._on_count = on_count  # the metrics counter, when metrics are on
        self._peers: dict[str, _PeerTally] = {}
        self._others: Counter[str] = Counter()  # peers beyond the cap, this interval
        self._timer: asyncio.TimerHandle | None = None
        self._interval_started = 0.0

    def add(self, peer: str, kind: str, message: str) -> None:
        if len(message) > MESSAGE_CHARS:
            message = f"{message[:MESSAGE_CHARS]}... ({len(message)} characters)"
        peer = peer[:64]  # a ROUTER identity is at most 255 bytes; ours are 5
        self.totals[kind] += 1
        if self._on_count is not None:
            self._on_count(kind)
        tally = self._peers.get(peer)
        if tally is None:
            if len(self._peers) >= MAX_PEERS_NAMED_PER_INTERVAL:
                self._others[kind] += 1
                return
            tally = self._peers[peer] = _PeerTally(message)
            log.warning(
                "%s from peer %s: %s (more from this peer are counted and reported every %g s)",
                _label(kind),
                peer,
                message,
                self.interval_s,
            )
        tally.kinds[kind] += 1
        self._arm()

    def _arm(self) -> None:
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # outside a loop (unit use): report() is called by hand
            self._interval_started = time.monotonic()
            self._timer = loop.call_later(self.interval_s, self.report)

    def report(self) -> None:
        """One line per peer that sent more than the complaint already logged, one for peers over the cap."""
        self._timer = None
        seconds = max(time.monotonic() - self._interval_started, 0.0) if self._interval_started else self.interval_s
        peers, others = self._peers, self._others
        self._peers, self._others = {}, Counter()
        for peer, tally in peers.items():
            total = sum(tally.kinds.values())
            if total > 1:
                log.warning(
                    "%d bad frames from peer %s in the last %.0f s (%s), first: %s",
                    total,
                    peer,
                    seconds,
                    _kinds(tally.kinds),
                    tally.first,
                )
        if others:
            log.warning(
                "%d bad frames from other peers in the last %.0f s (%s; only %d peers are named per interval)",
                sum(others.values()),
                seconds,
                _kinds(others),
                MAX_PEERS_NAMED_PER_INTERVAL,
            )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self.report()


def _label(kind: str) -> str:
    return {MALFORMED: "malformed frame", VERSION: "protocol version mismatch"}.get(kind, "bad request")


def _kinds(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts.most_common())
