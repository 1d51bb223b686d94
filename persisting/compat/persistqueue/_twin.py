"""The blocking twins of the async classes, made here and nowhere else (like ``persisting.sync``): each method
runs the async method of the same name on persisting's engine loop and blocks for it, so a sync and an async
queue share one implementation, and the sync one is safe to call from many threads."""

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


# Blocking handles not closed yet: closed at interpreter exit (while the engine loop still runs), as persist-queue's
# connections and files are, so that leases end and deletes are written.
_open: weakref.WeakSet[Any] = weakref.WeakSet()
CLOSE_AT_EXIT_S = 10.0


def opened(handle: Any) -> None:
    _open.add(handle)


def close_once(handle: Any, close: Callable[[], Coroutine[Any, Any, None]], timeout_s: float | None = None) -> None:
    """``handle.close()``: runs ``close`` once (later calls, ``__del__`` after ``close()``, do nothing)."""
    if handle.__dict__.get("_closed", False):
        return
    handle.__dict__["_closed"] = True
    _open.discard(handle)
    _engine.close_soon(close(), timeout_s)


@atexit.register
def _close_all() -> None:
    for handle in list(_open):
        try:
            handle.close()
        except Exception:  # one broken handle must not keep the others open at exit
            logging.getLogger("persisting.compat").exception("closing %r at exit failed", handle)
