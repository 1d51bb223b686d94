"""The blocking twins of the async classes, made here and nowhere else (like ``persisting.sync``): each method
runs the async method of the same name on persisting's engine loop and blocks for it (in the calling thread while
the loop is idle: ``client/_loop.run``), so a sync and an async queue share one implementation, and the sync one
is safe to call from many threads."""

from __future__ import annotations

import atexit
import functools
import logging
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from .. import _engine


def blocking(impl: type, name: str) -> Callable[..., Any]:
    method = getattr(impl, name)

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _engine.run(getattr(self._impl, name)(*args, **kwargs))

    return call


def twin(impl: type, names: tuple[str, ...]) -> Callable[[type], type]:
    """Class decorator: add the blocking form of each async method ``names`` of ``impl``."""

    def decorate(cls: type) -> type:
        for name in names:
            setattr(cls, name, blocking(impl, name))
        return cls

    return decorate


# Blocking handles not closed yet. At interpreter exit nothing can close them any more (the thread pool the engine
# writes Lance with is shut down before atexit runs), and nothing needs to: every put is in the write-ahead log, and
# gets not made final die with the process. The exit stops the engine loop instead, so that the flush loops of
# topics left open do not retry against the shut-down pool while the interpreter finalizes.
# (by id: PDict is a dict, so unhashable)
_open: dict[int, weakref.ref[Any]] = {}
CLOSE_AT_EXIT_S = 10.0


def opened(handle: Any) -> None:
    _open[id(handle)] = weakref.ref(handle)


def close_once(handle: Any, close: Callable[[], Coroutine[Any, Any, None]], timeout_s: float | None = None) -> None:
    """``handle.close()``: runs ``close`` once (later calls, ``__del__`` after ``close()``, do nothing)."""
    if handle.__dict__.get("_closed", False):
        return
    handle.__dict__["_closed"] = True
    _open.pop(id(handle), None)
    if timeout_s is None:
        _engine.close_soon(close(), timeout_s)
        return
    try:  # from __del__: an error there can only be printed, one line is enough (its folder was deleted, say)
        _engine.close_soon(close(), timeout_s)
    except Exception as exc:
        logging.getLogger("persisting.compat").warning("closing %s when it was collected failed: %r", handle, exc)


@atexit.register
def _at_exit() -> None:
    left = [h for h in (ref() for ref in _open.values()) if h is not None]
    _open.clear()
    for handle in left:
        handle.__dict__["_closed"] = True  # a later __del__ must not try
    if left:
        _engine.stop_engine_loop()
