"""SyncQueue: the blocking twin of Queue, generated here and nowhere else.

Each method runs the async method of the same name on the engine loop and waits for it, so both twins
share one implementation, one engine and the same files; SyncQueue is safe to call from many threads. While the
loop is idle the call runs in the calling thread with the loop's baton (``_loop.run``): no thread hop.
``SyncQueue.reserve`` gives a ``SyncReservation``, the blocking twin of ``Reservation`` (``with`` abandons it
on exit unless it was put); every method takes it where the async one takes the Reservation.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from typing import Any

from ..tensors.reservation import Reservation
from . import _loop
from .queue import Queue


def _blocking(name: str) -> Callable[..., Any]:
    method = getattr(Queue, name)

    @functools.wraps(method)
    def call(self: SyncQueue, *args: Any, **kwargs: Any) -> Any:
        args = tuple(map(_unwrap, args))
        if kwargs:
            kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
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
    give_back = _blocking("give_back")
    stats = _blocking("stats")
    abandon = _blocking("abandon")
    close = _blocking("aclose")
    kv_put = _blocking("kv_put")
    kv_get = _blocking("kv_get")
    kv_list = _blocking("kv_list")
    kv_clear = _blocking("kv_clear")
    kv_names = _blocking("kv_names")

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

    def reserve(
        self,
        spec: Mapping[str, tuple[Any, Any]],
        batch_size: int,
        partition_id: str = "default",
        *,
        timeout: float | None = None,
    ) -> SyncReservation:
        return SyncReservation(_loop.run(self._queue._reserve(spec, batch_size, partition_id, timeout)))

    reserve.__doc__ = "Blocking form of ``await Queue.reserve(...)``; ``with q.reserve(...) as r:``. " + (
        Queue.reserve.__doc__ or ""
    )

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


class SyncReservation:
    """The blocking twin of ``persisting.reservation.Reservation``, from ``SyncQueue.reserve``: fill ``r["obs"]``,
    then ``q.put(r)``; ``r.abandon()`` gives the space back; ``with`` abandons it on exit unless it was put."""

    def __init__(self, reservation: Reservation) -> None:
        self.reservation = reservation  # the async one, which does the work

    @property
    def data(self) -> Mapping[str, Any]:
        return self.reservation.data

    @property
    def batch_size(self) -> int:
        return self.reservation.batch_size

    @property
    def partition_id(self) -> str:
        return self.reservation.partition_id

    @property
    def nbytes(self) -> int:
        return self.reservation.nbytes

    @property
    def in_arena(self) -> bool:
        return self.reservation.in_arena

    @property
    def state(self) -> str:
        return self.reservation.state

    @property
    def names(self) -> list[str]:
        return self.reservation.names

    def keys(self) -> list[str]:
        return self.reservation.keys()

    def __getitem__(self, name: str) -> Any:
        return self.reservation[name]

    def __contains__(self, name: object) -> bool:
        return name in self.reservation

    def __iter__(self) -> Iterator[str]:
        return iter(self.reservation)

    def __len__(self) -> int:
        return len(self.reservation)

    def __repr__(self) -> str:
        return "Sync" + repr(self.reservation)

    def abandon(self) -> bool:
        """Blocking form of ``await Reservation.abandon()``."""
        return _loop.run(self.reservation.abandon())

    def __enter__(self) -> SyncReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        _loop.run(self.reservation.__aexit__(*exc))


def _unwrap(value: Any) -> Any:
    return value.reservation if type(value) is SyncReservation else value


async def _anext(agen: AsyncGenerator[list[dict[str, Any]], None]) -> list[dict[str, Any]]:
    return await agen.__anext__()
