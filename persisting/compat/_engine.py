"""Every use of persisting internals by the compat layers, in one place (the rest imports public names only).

- ``run``: runs a coroutine on the engine's loop and blocks for it, as ``SyncQueue`` does (``client/_loop.run``:
  in the calling thread while the loop is idle, so a compat queue's blocking call costs no thread hop unless it
  has to wait; the ``Queue`` calls inside it run without one either way).
- ``call``: awaits a coroutine on the engine's loop from any other loop (the TransferQueue layer's async calls).
- ``close_soon``: a close from ``close()``, ``__del__`` or exit, on the engine loop without blocking it.
- ``stop_engine_loop``: at exit, for queues left open (see ``persistqueue._twin``).
- ``take_records``: a take of records and their bytes in one step, embedded on the engine loop and through a
  broker in one round trip (``Queue.get_meta`` + ``get_data`` cost ~2.5x as much for one small record), through
  a broker with a record of the take written in the same round trip.
- ``mark_consumed``: ``Queue.mark_consumed`` without its argument checks (the layer passes the indexes it took),
  and with the put of the records that say so (through a broker in the same round trip).
- ``read_window``: records from a global index on, with where the window ended (``Queue.get`` does not say,
  and a window holding cleared samples' rows returns fewer rows than it spans).
- ``put_records``: ``Queue.put_batch``, or embedded with ``durable=False`` a put that waits for no fdatasync of its
  own (``puts.Appender``; through a broker every put is durable).
- ``embedded``: whether the queue's engine runs in this process (no other process reads or writes its topic).
- ``consumed``: the samples a task has consumed, embedded (what a restart's repair compares the state records to).

Each is one call of the queue's topic (``persisting.client.topic_api.TopicAPI``), which knows its own mode.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from persisting import Queue, Sampler
from persisting.client import _loop
from persisting.client.queue import _encode

T = TypeVar("T")
_closing: set[asyncio.Future[None]] = set()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return _loop.run(coro)


async def call(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the engine loop from any event loop."""
    return await _loop.call(coro)


async def mark_consumed(
    queue: Queue,
    partition: str,
    task: str,
    indexes: list[int],
    then_put: tuple[str, list[dict[str, Any]]] | None = None,
) -> range | None:
    """Consume ``indexes``; ``then_put``, (partition, records): a durable put of them after the consumption is
    logged, its range returned (through a broker in the same round trip)."""
    topic = await queue._handle.engine()
    if then_put is None:
        return await topic.mark_consumed(partition, task, indexes)
    batch, blob = _encode(then_put[1], topic.kinds)
    # a broker with riders (broker/requests/riders.py) puts them in the same round trip
    return await topic.mark_consumed(partition, task, indexes, (then_put[0], batch, blob))


async def read_window(queue: Queue, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    return await queue._read(limit, offset)


def close_soon(coro: Coroutine[Any, Any, None], timeout_s: float | None = None) -> None:
    """Run a close on the engine loop from anywhere: blocks for it from another thread (up to ``timeout_s``),
    schedules it from the loop's own thread (a ``__del__`` run by the garbage collector there), and drops it while
    the interpreter finalizes (the loop's daemon thread is frozen then: waiting for it would hang the exit)."""
    if sys.is_finalizing():
        coro.close()
        return
    if _loop.on_engine_loop():
        task = asyncio.ensure_future(coro)
        _closing.add(task)  # the loop keeps only a weak reference to its tasks
        task.add_done_callback(_closing.discard)
        return
    asyncio.run_coroutine_threadsafe(coro, _loop.engine_loop()).result(timeout_s)


def stop_engine_loop() -> None:
    """At interpreter exit: stop the engine loop (its thread is a daemon; what it holds is in the logs already)."""
    loop = _loop.engine_loop()
    loop.call_soon_threadsafe(loop.stop)


async def take_records(
    queue: Queue,
    partition: str,
    task: str,
    timeout: float | None,
    sampler: Sampler | None,
    lease_s: float | None,
    fields: list[str],
    batch_size: int = 1,
    note: dict[str, Any] | None = None,
) -> tuple[list[tuple[int, dict[str, Any]]], range | None]:
    """A take of up to ``batch_size`` samples and their ``fields`` as stored now (a later write of a field, an
    update, wins), without get_meta's and get_data's field descriptions and batch building, which cost more than
    the take itself for a small record: embedded, in one step on the engine loop; through a broker, in one round
    trip (get_meta + get_data would be two). ``note`` (through a broker only): a record per sample taken, written
    by the broker before it replies (``TopicAPI.take_rows``); its range comes second (always None embedded)."""
    topic = await queue._handle.engine()
    return await topic.take_rows(partition, task, batch_size, timeout, sampler, lease_s, fields, note)


async def put_records(queue: Queue, partition: str, records: list[dict[str, Any]], durable: bool = True) -> range:
    if durable:
        return await queue.put_batch(records, partition_id=partition)
    topic = await queue._handle.engine()
    batch, blob = _encode(records, topic.kinds)
    first, n = await topic.append(batch, partition, blob, durable=False)  # (a broker's puts are always durable)
    return range(first, first + n)


async def consumed(queue: Queue, partition: str, task: str) -> set[int] | None:
    """The global indexes ``task`` consumed in ``partition`` (not those it holds leased); None through a broker."""
    return await (await queue._handle.engine()).consumed(partition, task)


async def embedded(queue: Queue) -> bool:
    """Whether no other process reads or writes the queue's topic (``TopicAPI.exclusive``)."""
    return (await queue._handle.engine()).exclusive
