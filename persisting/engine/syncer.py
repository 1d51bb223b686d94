"""The thread that runs a write-ahead log's fdatasync rounds, off the engine's loop.

One daemon thread per log in ``sync`` durability, started with the first round and stopped at close. The loop
hands it a round (``run``) and gets an asyncio future that the thread settles through ``call_soon_threadsafe``.
Why not ``asyncio.to_thread``: a round is the whole wait of a durable put, and to_thread pays for a copied context,
the shared executor's queue and locks, a ``concurrent.futures.Future`` with its condition variable and the chaining
of that future into an asyncio one, on the loop's thread and the worker's, each step taking the GIL again; and the
shared executor also runs the flush's Lance writes, so a round could queue behind them. Here a round costs one
queue put, one blocking get and one ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]", Callable[[], None]]


class Syncer:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, job: Callable[[], None]) -> asyncio.Future[None]:
        """Run ``job`` (blocking I/O) on the thread; the future settles with its outcome on the calling loop."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((loop, done, job))
        return done

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            loop, done, job = item
            error: BaseException | None = None
            try:
                job()
            except BaseException as exc:  # handed to the awaiting put, which raises it
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody awaits the round any more
                loop.call_soon_threadsafe(_settle, done, error)

    def stop(self) -> None:
        """End the thread once the rounds handed to it ran (the log awaits its last round before closing)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
