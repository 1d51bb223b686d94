"""The one background event loop: home of every embedded engine and the engine of every SyncQueue.

All engine state is touched only by whoever holds the loop's baton, so the engine needs no locks. The loop's
thread holds it except while it waits in ``select`` for something to do. Callers on other loops reach the loop
through ``call`` (async); blocking callers through ``run``, which runs the coroutine in the calling thread when
the loop is idle (the baton is free and the loop does not want it back) and hands it to the loop at its first
real wait. A blocking call that never waits for anything (a put's log write and its fdatasync, a take from the
tail) then costs no thread hand-off at all; one that waits costs what a hop costs. Both propagate cancellation.

A blocking caller's step may itself block outside the engine (broker mode: its request on its own socket,
``client/blocking.py``) inside ``baton_lent()``: the baton is given up for that wait, as an ``await`` would give
the loop up, and taken back after; the loop and other callers run meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import selectors
import sys
import threading
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

from ..engine import caller_thread

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
# Held by the loop's thread except while it waits in select; a blocking caller that gets it runs engine code.
_baton = threading.Lock()
# Set by the loop's thread when select returned and it waits for the baton: callers then hop instead of taking
# the baton again, so a caller calling in a tight loop cannot starve the loop's own work (flushes, timers).
_loop_wants_baton = threading.Event()
# The loop's (firstiter, finalizer) hooks, which an inline step installs as the loop's thread has them.
_loop_hooks: tuple[Any, Any] = (None, None)
# Per blocking caller: the loop's count of timers when this thread last took the baton (see _woken).
_step = threading.local()


def _reset_after_fork() -> None:
    # The thread does not survive fork; a child must start its own loop (and should use spawn anyway:
    # Lance is not fork-safe).
    global _loop, _thread, _lock, _baton, _loop_wants_baton
    _loop, _thread, _lock = None, None, threading.Lock()
    _baton, _loop_wants_baton = threading.Lock(), threading.Event()


os.register_at_fork(after_in_child=_reset_after_fork)


class _BatonSelector(selectors.DefaultSelector):
    """The loop's selector: gives the baton up while the loop waits for events."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        baton, wants = _baton, _loop_wants_baton
        baton.release()
        try:
            return super().select(timeout)
        finally:
            wants.set()
            baton.acquire()
            wants.clear()


def engine_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread, _loop_hooks
    started = _loop
    if started is not None:  # every call asks: no lock once it runs
        return started
    with _lock:
        if _loop is None:
            loop = asyncio.SelectorEventLoop(_BatonSelector())
            ready = threading.Event()
            baton = _baton

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                baton.acquire()
                try:
                    loop.run_forever()
                finally:
                    baton.release()

            _thread = threading.Thread(target=serve, name="persisting-engine", daemon=True)
            _thread.start()
            ready.wait()
            _loop_hooks = _asyncgen_hooks(loop)  # made once: each access makes two bound methods
            _loop = loop
        return _loop


def on_engine_loop() -> bool:
    loop = _loop
    return loop is not None and asyncio._get_running_loop() is loop


async def call(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the engine loop from any loop."""
    loop = engine_loop()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the engine loop and block this thread for its result."""
    loop = engine_loop()
    if on_engine_loop():
        coro.close()
        raise RuntimeError(
            "a blocking SyncQueue call was made from inside the persisting engine loop; use the async Queue there"
        )
    # (asyncio's debug mode checks that only the loop's thread schedules on it: no inline steps there)
    if not _loop_wants_baton.is_set() and not loop.get_debug() and _baton.acquire(blocking=False):
        return _run_inline(coro, loop)
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def _run_inline(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """With the baton held: step ``coro`` in this thread, with ``loop`` as its running loop, up to its end or its
    first wait; a coroutine that waits goes on as a task of the loop, and this thread blocks for its result."""
    waiting: concurrent.futures.Future[T] | None = None
    _step.scheduled = len(loop._scheduled)  # type: ignore[attr-defined]
    outer, outer_hooks = asyncio._get_running_loop(), sys.get_asyncgen_hooks()
    try:
        # As on the loop's thread: the running loop, and async generators first iterated here belong to it.
        asyncio._set_running_loop(loop)
        sys.set_asyncgen_hooks(*_loop_hooks)
        try:
            with caller_thread():
                pending = coro.send(None)
        except StopIteration as stop:
            return stop.value
        finally:
            asyncio._set_running_loop(outer)
            sys.set_asyncgen_hooks(*outer_hooks)
        waiting = concurrent.futures.Future()
        task = loop.create_task(_resume(coro, pending))
        task.add_done_callback(lambda done: _settle(done, waiting))
    finally:
        _give_baton_back(loop)
    return waiting.result()


def _give_baton_back(loop: asyncio.AbstractEventLoop) -> None:
    # What the step scheduled on the loop (callbacks, timers, the task) must not wait for the loop's next
    # wake-up: wake it unless it has nothing new to do.
    wake = bool(loop._ready) or len(loop._scheduled) != _step.scheduled  # type: ignore[attr-defined]
    _baton.release()
    if wake:
        loop.call_soon_threadsafe(_nothing)


class _Lent:
    """``with baton_lent():`` a class, not a generator context manager: every blocking broker request enters it."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def __enter__(self) -> None:
        _give_baton_back(self._loop)

    def __exit__(self, *exc: object) -> None:
        _baton.acquire()
        _step.scheduled = len(self._loop._scheduled)  # type: ignore[attr-defined]


def baton_lent() -> _Lent:
    """Inside a blocking caller's inline step (``engine.inline.blocking_allowed()``): give the baton up while this
    thread waits on something that is not the engine's (a broker's reply), and take it back after. Like an
    ``await``, it lets the loop and other callers run engine and client code meanwhile."""
    loop = _loop
    if loop is None:  # pragma: no cover - an inline step runs only once the loop exists
        raise RuntimeError("baton_lent() outside a blocking caller's step")
    return _Lent(loop)


def _asyncgen_hooks(loop: asyncio.AbstractEventLoop) -> tuple[Any, Any]:
    """The (firstiter, finalizer) pair ``loop.run_forever`` installs on its own thread."""
    return loop._asyncgen_firstiter_hook, loop._asyncgen_finalizer_hook  # type: ignore[attr-defined]


def _nothing() -> None:
    pass


def _settle(task: asyncio.Task[T], waiting: concurrent.futures.Future[T]) -> None:
    if task.cancelled():
        waiting.cancel()
    elif (exc := task.exception()) is not None:
        waiting.set_exception(exc)
    else:
        waiting.set_result(task.result())


async def _resume(coro: Coroutine[Any, Any, T], pending: Any) -> T:
    return await _Started(coro, pending)


class _Started:
    """A coroutine that was stepped already and now waits on ``pending`` (what its last step yielded): awaiting
    this hands ``pending`` to the task that awaits it and goes on stepping the coroutine, as ``await coro`` would
    have done from the start."""

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._pending
        self._pending = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation, thrown into the coroutine where it waits
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
