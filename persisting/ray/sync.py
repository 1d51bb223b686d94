"""``persisting.ray.SyncQueue``: the blocking twin of ``persisting.ray.Queue`` (for plain Ray tasks), made here only.

Each method runs the async one on persisting's engine loop (``client/_loop.py``) and waits, as ``SyncQueue``
does for ``Queue``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..client import _loop
from .methods import ROUTED
from .queue import Queue


def _blocking(name: str) -> Callable[..., Any]:
    method = getattr(Queue, name)

    @functools.wraps(method)
    def call(self: SyncQueue, *args: Any, **kwargs: Any) -> Any:
        return _loop.run(getattr(self._queue, name)(*args, **kwargs))

    return call


class SyncQueue:
    """Same constructor and methods as ``persisting.ray.Queue``, without ``await``; ``with`` closes it."""

    put = _blocking("put")
    get_meta = _blocking("get_meta")
    get_data = _blocking("get_data")
    get_batch = _blocking("get_batch")
    clear = _blocking("clear")
    flush = _blocking("flush")
    owner = _blocking("owner")
    close = _blocking("aclose")

    def __init__(self, name: str, **options: Any) -> None:
        self._queue = Queue(name, **options)

    @property
    def name(self) -> str:
        return self._queue.name

    @property
    def node_id(self) -> str:
        return self._queue.node_id

    def __enter__(self) -> SyncQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


for _name in ROUTED:  # the blocking twin of every forwarded method
    setattr(SyncQueue, _name, _blocking(_name))
