"""SyncQueue: the blocking twin of Queue, generated here and nowhere else.

Each method runs the async method of the same name on the engine loop and waits for it, so both twins
share one implementation, one engine and the same files; SyncQueue is safe to call from many threads.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

from . import _loop
from .client import Queue


def _blocking(name: str) -> Callable[..., Any]:
    method = getattr(Queue, name)

    @functools.wraps(method)
    def call(self: SyncQueue, *args: Any, **kwargs: Any) -> Any:
        return _loop.run(getattr(self._queue, name)(*args, **kwargs))

    call.__doc__ = f"Blocking form of ``await Queue.{name}(...)``. " + (method.__doc__ or "")
    return call


class SyncQueue:
    """Same constructor and methods as Queue, without ``await``; ``with`` closes (and flushes) it."""

    open = _blocking("open")
    put = _blocking("put")
    put_batch = _blocking("put_batch")
    flush = _blocking("flush")
    get = _blocking("get")
    get_meta = _blocking("get_meta")
    get_data = _blocking("get_data")
    get_batch = _blocking("get_batch")
    check_ready = _blocking("check_ready")
    clear = _blocking("clear")
    partitions = _blocking("partitions")
    set_custom_meta = _blocking("set_custom_meta")
    mark_consumed = _blocking("mark_consumed")
    reset_consumption = _blocking("reset_consumption")
    stats = _blocking("stats")
    close = _blocking("aclose")

    def __init__(self, name: str, storage_path: Any = "./data", **options: Any) -> None:
        self._queue = Queue(name, storage_path, **options)
        self.open()

    @property
    def name(self) -> str:
        return self._queue.name

    def __len__(self) -> int:
        return len(self._queue)

    def __repr__(self) -> str:
        return "Sync" + repr(self._queue)

    def stream(
        self,
        limit: int | None = None,
        offset: int = 0,
        wait: bool = False,
        timeout: float | None = None,
    ) -> Iterator[list[dict[str, Any]]]:
        """Blocking form of ``Queue.stream``: an iterator of lists of records."""
        agen = self._queue.stream(limit, offset, wait, timeout)
        if not isinstance(agen, AsyncGenerator):  # pragma: no cover - stream is an async generator
            raise TypeError("Queue.stream must be an async generator")
        try:
            while True:
                try:
                    yield _loop.run(_anext(agen))
                except StopAsyncIteration:
                    return
        finally:
            _loop.run(agen.aclose())

    def __enter__(self) -> SyncQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _anext(agen: AsyncGenerator[list[dict[str, Any]], None]) -> list[dict[str, Any]]:
    return await agen.__anext__()
