"""Replies that do not decode, from one broker: dropped, and logged once per interval, never once per reply.

Both ways a client reads replies (the loop's ``connection.py`` and a blocking caller's ``blocking.py``) decode
through ``BadReplies.decode``. A broker of another protocol version, or anything else writing garbage to the
socket, would otherwise turn each bad frame into a log line. The first bad reply of an interval is logged at once
(whoever watches sees it), the rest are counted, and the next one after the interval logs how many were dropped
since. The broker's side of the same rule is ``broker/complaints.py``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import errors
from ..wire import protocol
from ..wire.protocol import Reply

log = logging.getLogger(__name__)

BAD_REPLY_LOG_INTERVAL_S = 10.0


class BadReplies:
    """Malformed replies from the broker at ``address``: counted; logged at most once per interval."""

    def __init__(self, address: str, interval_s: float = BAD_REPLY_LOG_INTERVAL_S) -> None:
        self.address = address
        self.interval_s = interval_s
        self.total = 0  # since this client connected
        self._unlogged = 0  # dropped since the last line
        self._logged_at: float | None = None

    def decode(self, frames: list[Any]) -> Reply | None:
        """The reply ``frames`` hold, or None for a malformed one (dropped, counted, maybe logged)."""
        try:
            return protocol.decode_reply(frames)
        except errors.ProtocolError as exc:
            self._note(str(exc))
            return None

    def _note(self, message: str) -> None:
        self.total += 1
        self._unlogged += 1
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < self.interval_s:
            return
        more = f" ({self._unlogged - 1} more dropped since the last such line)" if self._unlogged > 1 else ""
        log.warning("ignoring a malformed reply from %s: %s%s", self.address, message, more)
        self._logged_at, self._unlogged = now, 0
