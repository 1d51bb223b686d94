"""The one background event loop: home of every embedded engine and the engine of every SyncQueue.

All engine state is touched only from this loop's thread, so the engine needs no locks. Callers on other
loops or threads reach it through ``call`` (async) or ``run`` (blocking); both propagate cancellation.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _reset_after_fork() -> None:
    # The thread does not survive fork; a child must start its own loop (and should use spawn anyway:
    # Lance is not fork-safe).
    global _loop, _thread, _lock
    _loop, _thread, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def engine_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            _thread = threading.Thread(target=serve, name="persisting-engine", daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def on_engine_loop() -> bool:
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False


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
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
