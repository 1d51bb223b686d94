"""The blocking twins of the async classes, made here and nowhere else (like ``persisting.sync``): each method
runs the async method of the same name on persisting's engine loop and blocks for it, so a sync and an async
queue share one implementation, and the sync one is safe to call from many threads."""

from __future__ import annotations

import functools
from collections.abc import Callable
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
