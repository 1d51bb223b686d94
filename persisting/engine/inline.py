"""Whether the engine code running now runs inline in a blocking caller's thread.

Embedded mode's blocking calls (``client/_loop.run``) run engine code in the caller's own thread when the engine
loop is idle, holding the loop's baton (the loop runs nothing meanwhile, so the engine still needs no locks).
There, a step that would hand blocking I/O to a worker thread and await it (the write-ahead log's fdatasync) may
do the I/O directly instead: only the caller, which waits for its result anyway, is blocked, and two thread
hand-offs are saved. Everywhere else (the loop's own thread, the broker) this says False.

Contract: ``blocking_allowed()`` is True only inside ``caller_thread()``; the code that enters it holds the engine
loop's baton and has made that loop this thread's running loop for the duration.
"""

from __future__ import annotations

import threading

_state = threading.local()


def blocking_allowed() -> bool:
    """True when this thread is a blocking caller running engine code inline (it may block on I/O itself)."""
    return getattr(_state, "inline", False)


class _CallerThread:
    """``with caller_thread():`` a class, not a generator context manager: every blocking call enters it."""

    __slots__ = ("_before",)

    def __enter__(self) -> None:
        self._before = getattr(_state, "inline", False)
        _state.inline = True

    def __exit__(self, *exc: object) -> None:
        _state.inline = self._before


def caller_thread() -> _CallerThread:
    """Mark this thread as running engine code inline for a blocking caller (see the module doc)."""
    return _CallerThread()
