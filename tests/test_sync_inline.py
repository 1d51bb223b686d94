"""Blocking calls run inline in the caller's thread when the engine loop is idle (client/_loop.run): a sync put's
fdatasync happens in the caller's thread, and many threads plus the loop's own work (flushes, async callers)
still see every record exactly once."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from persisting import Queue, SyncQueue
from persisting.client import _loop


def test_sync_put_fdatasyncs_in_the_calling_thread(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced_in: list[int] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced_in.append(threading.get_ident())
        real(fd)

    with SyncQueue("inline", storage_path=store, durability="sync") as q:
        q.put({"i": 0})  # the first put opens things; later puts are the steady state
        monkeypatch.setattr(os, "fdatasync", recording)
        for i in range(1, 20):
            q.put({"i": i})
        monkeypatch.setattr(os, "fdatasync", real)
        assert len(q) == 20
    # A put that found the loop busy (a flush just then) may have hopped; most must not have.
    mine = sum(1 for t in synced_in if t == threading.get_ident())
    assert mine >= 10, f"only {mine} of {len(synced_in)} log syncs ran in the calling thread"


def test_a_step_that_waits_goes_on_as_a_loop_task(store: Path) -> None:
    """A coroutine that awaits something mid-way (here a sleep) is handed to the loop and finishes there."""

    async def two_halves() -> tuple[int, int]:
        first = threading.get_ident()
        await asyncio.sleep(0.01)
        return first, threading.get_ident()

    first, second = _loop.run(two_halves())
    assert second == _loop._thread.ident if _loop._thread else False
    assert first in (threading.get_ident(), second)

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("from the loop")

    with pytest.raises(ValueError, match="from the loop"):
        _loop.run(fails())


def test_threads_and_async_callers_together_exactly_once(store: Path) -> None:
    threads_n, per_thread = 4, 150
    with SyncQueue("mixed", storage_path=store, durability="sync", batch_size=64) as q:

        def putter(k: int) -> None:
            for i in range(per_thread):
                q.put({"k": k, "i": i})

        async def async_puts() -> None:
            async with Queue("mixed", storage_path=store) as aq:
                for i in range(per_thread):
                    await aq.put({"k": threads_n, "i": i})

        workers = [threading.Thread(target=putter, args=(k,)) for k in range(threads_n)]
        workers.append(threading.Thread(target=asyncio.run, args=(async_puts(),)))
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rows = q.get(limit=10_000)
        q.flush()
        assert q.stats()["flushed"] == len(rows)
    seen = sorted((r["k"], r["i"]) for r in rows)
    assert seen == [(k, i) for k in range(threads_n + 1) for i in range(per_thread)]
    with SyncQueue("mixed", storage_path=store) as again:  # what a reopen replays and reads back is the same
        assert sorted((r["k"], r["i"]) for r in again.get(limit=10_000)) == seen


def test_a_tight_loop_of_blocking_calls_leaves_the_loop_its_turn(store: Path) -> None:
    """The loop's own work (a timer here) runs while a thread calls in a tight loop without pause."""
    loop = _loop.engine_loop()
    fired = threading.Event()
    with SyncQueue("tight", storage_path=store, durability="process") as q:
        loop.call_soon_threadsafe(loop.call_later, 0.05, fired.set)
        for i in range(3000):
            q.put({"i": i})
            if fired.is_set():
                break
        assert fired.is_set(), "the engine loop's timer never ran during 3000 back-to-back blocking puts"
