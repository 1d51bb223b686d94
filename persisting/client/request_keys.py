"""Keys that name a client's requests to the broker, so that a request sent again is acted on once: a put's
idempotency key (kept in the broker's write-ahead log) and a take's key (kept in memory for a while).

Both are a random prefix per process (drawn again in a forked child) and a counter, at a tenth of a uuid4's cost.
"""

from __future__ import annotations

import itertools
import os
import uuid


class _Keys:
    """Keys from a random prefix per process (drawn again in a forked child) and a counter, at a tenth of a
    uuid4's cost (~5 us), which every get_meta and every put pays."""

    def __init__(self, prefix_chars: int) -> None:
        self.prefix_chars = prefix_chars
        self.draw()

    def draw(self) -> None:
        self.prefix = uuid.uuid4().hex[: self.prefix_chars]
        self.counter = itertools.count()

    def new(self) -> str:
        return f"{self.prefix}{next(self.counter):x}"


# A take's key: as unique as a uuid4 for what the broker remembers of takes (a while, in memory).
_take_keys = _Keys(16)
# A put's idempotency key is kept in the log: the whole uuid4 (122 random bits) as the prefix, so two keys of
# different processes are equal only if two uuid4 are.
_put_keys = _Keys(32)
for _keys in (_take_keys, _put_keys):
    os.register_at_fork(after_in_child=_keys.draw)
take_key = _take_keys.new
put_key = _put_keys.new
