"""Arena space this process is done with and has not told its broker yet: holds whose views died, extents leased
for reservations that were dropped unput. One book per process, per broker address, per arena generation.

Why per process and not per connection: views die whenever the garbage collector says, in any thread, often
after the event loop that made them has ended (a program that runs ``asyncio.run()`` per step drops the last
view as that loop closes). The book outlives every loop and connection, and it is emptied three ways, whichever
comes first:

- the next tensor request of this process to that broker, from any loop, carries it (``take``: no extra round
  trip);
- a short timer (FLUSH_DELAY_SECONDS) on the loop that made the views, while it runs, sends it on that loop's
  connection (the common case: for a consumer on its own loop it wakes no other thread);
- a slower timer (FALLBACK_SECONDS, at most one pending per broker) on the engine loop (``_loop.engine_loop()``,
  the background loop every client process may start) sends it on that loop's own connection, so views that
  died as their loop ended, or in a thread without a loop, are given back even if the process makes no request
  any more;
- ``aclose()`` of a broker-mode queue sends it before it returns (``flush``).

Why per generation: hold and extent ids start again at 1 in a restarted broker. Each entry names the arena
generation its ids came from, and the broker ignores entries of another generation, so a view of the old broker
that dies late can never release the hold, with the same number, that this process got from the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from typing import Any

from .. import errors
from ..tensors.arena import peer_id
from . import _loop
from .connection import connection

FLUSH_DELAY_SECONDS = 0.02  # releases that come together (a batch's views) go in one request
FALLBACK_SECONDS = 0.5  # the engine loop's timer: rare enough not to compete with a busy consumer for the GIL
SEND_TIMEOUT_SECONDS = 10.0

# Reentrant: a finalizer (a view collected by the garbage collector) may run inside a section that holds it.
_lock = threading.RLock()
# address -> generation -> ([hold ids], [extent ids to abandon])
_book: dict[str, dict[bytes, tuple[list[int], list[int]]]] = {}
_armed: set[str] = set()  # addresses with a timer pending on the engine loop
_armed_fast: set[str] = set()  # addresses with a short timer pending on a caller's loop


def _reset_after_fork() -> None:
    global _lock
    _lock = threading.RLock()
    _book.clear()  # the parent's holds are the parent's to release
    _armed.clear()
    _armed_fast.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def release(address: str, generation: bytes, hold: int, loop: asyncio.AbstractEventLoop | None) -> None:
    """The views of ``hold`` (made on ``loop``) are gone: from a finalizer, in any thread, at any time, maybe after
    that loop ended."""
    _add(address, generation, hold, None, loop)


def abandon(address: str, generation: bytes, extent: int, loop: asyncio.AbstractEventLoop | None) -> None:
    """A reservation's extent will never be put (its arrays were dropped, or its put failed or was cancelled)."""
    _add(address, generation, None, extent, loop)


def _add(
    address: str, generation: bytes, hold: int | None, extent: int | None, loop: asyncio.AbstractEventLoop | None
) -> None:
    with _lock:
        holds, extents = _book.setdefault(address, {}).setdefault(generation, ([], []))
        if hold is not None:
            holds.append(hold)
        if extent is not None:
            extents.append(extent)
        arm = address not in _armed
        _armed.add(address)
        arm_fast = loop is not None and address not in _armed_fast
        if arm_fast:
            _armed_fast.add(address)
    if arm_fast and loop is not None:
        try:
            loop.call_soon_threadsafe(loop.call_later, FLUSH_DELAY_SECONDS, _send_fast, address)
        except RuntimeError:  # that loop has closed: the engine loop's timer sends it
            with _lock:
                _armed_fast.discard(address)
    if arm:
        # RuntimeError: the interpreter is shutting down (no new thread); the broker reaps this process's
        # holds and leases once it has exited.
        with contextlib.suppress(RuntimeError):
            loop = _loop.engine_loop()
            loop.call_soon_threadsafe(loop.call_later, FALLBACK_SECONDS, _send_soon, address)


def _send_fast(address: str) -> None:
    with _lock:
        _armed_fast.discard(address)
    _send_pending(address)


def take(address: str) -> list[list[Any]]:
    """Everything pending for ``address``, as a request's ``released`` argument: [[generation, holds, extents]]."""
    with _lock:
        by_generation = _book.pop(address, {})
        _armed_fast.discard(address)  # a short timer of a loop that ended will never clear it
    return [[gen, holds, extents] for gen, (holds, extents) in by_generation.items()]


def _send_soon(address: str) -> None:
    """On the engine loop: send what is still pending (no request of the process carried it meanwhile)."""
    with _lock:
        _armed.discard(address)
    _send_pending(address)


def _send_pending(address: str) -> None:
    released = take(address)
    if released:
        task = asyncio.ensure_future(_send(address, released))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def flush(address: str) -> None:
    """Send what is pending for ``address`` now, from the caller's loop (``aclose``)."""
    released = take(address)
    if released:
        await _send(address, released)


async def _send(address: str, released: list[list[Any]]) -> None:
    # Best effort: a broker that is gone has forgotten these holds and leases already.
    with contextlib.suppress(errors.PersistingError):
        await connection(address).request(
            "release", {"released": released, "peer": peer_id()}, timeout=SEND_TIMEOUT_SECONDS
        )
