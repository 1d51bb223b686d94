"""One write-then-read cycle per store. Each runner fills an empty folder with ``records``, reads them all back
(checking ids and count), and returns the two timings. Opening and closing are not timed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import persistqueue

from bench.common.measure import Tick
from bench.common.records import PUT_BATCH, check_page
from persisting import Queue

READ_PAGE = 10_000  # records per persisting get()

Records = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Timing:
    n: int
    write_s: float
    read_s: float

    @property
    def total_s(self) -> float:
        return self.write_s + self.read_s


@dataclass(frozen=True, slots=True)
class Store:
    key: str
    label: str
    settings: str
    is_peer: bool  # peers may be skipped when projected too slow; persisting always runs
    run: Callable[[Records, Path, Tick], Timing]


def _noop(_n: int) -> None:
    pass


async def _persisting_cycle(records: Records, path: Path, durability: str, batch_size: int, tick: Tick) -> Timing:
    n = len(records)
    q = Queue("bench", path, durability=durability, batch_size=batch_size)
    await q.open()
    try:
        t0 = time.perf_counter()
        for i in range(0, n, PUT_BATCH):
            batch = records[i : i + PUT_BATCH]
            await q.put_batch(batch)
            tick(len(batch))
        await q.flush()
        t1 = time.perf_counter()
        expect = 0
        for offset in range(0, n, READ_PAGE):
            page = await q.get(READ_PAGE, offset)
            expect = check_page(page, expect)
            tick(len(page))
        t2 = time.perf_counter()
    finally:
        await q.aclose()
    if expect != n:
        raise AssertionError(f"persisting read back {expect} records of {n}")
    return Timing(n, t1 - t0, t2 - t1)


def persisting_runner(durability: str, batch_size: int = 100) -> Callable[[Records, Path, Tick], Timing]:
    def run(records: Records, path: Path, tick: Tick) -> Timing:
        return asyncio.run(_persisting_cycle(records, path, durability, batch_size, tick))

    return run


def sqlite_runner(auto_commit: bool) -> Callable[[Records, Path, Tick], Timing]:
    def run(records: Records, path: Path, tick: Tick) -> Timing:
        n = len(records)
        q = persistqueue.SQLiteQueue(str(path), auto_commit=auto_commit)
        try:
            t0 = time.perf_counter()
            for i, rec in enumerate(records, 1):
                q.put(rec)
                if i % PUT_BATCH == 0:
                    if not auto_commit:
                        q.task_done()
                    tick(PUT_BATCH)
            q.task_done()
            tick(n % PUT_BATCH)
            t1 = time.perf_counter()
            expect = 0
            for i in range(1, n + 1):
                expect = check_page([q.get(block=False)], expect)
                if i % PUT_BATCH == 0:
                    q.task_done()
                    tick(PUT_BATCH)
            q.task_done()
            tick(n % PUT_BATCH)
            t2 = time.perf_counter()
        finally:
            q.close()
        return Timing(n, t1 - t0, t2 - t1)

    return run


def file_queue_run(records: Records, path: Path, tick: Tick) -> Timing:
    n = len(records)
    path.mkdir(parents=True, exist_ok=True)
    q = persistqueue.Queue(str(path), tempdir=str(path))
    t0 = time.perf_counter()
    for i, rec in enumerate(records, 1):
        q.put(rec)
        if i % PUT_BATCH == 0:
            tick(PUT_BATCH)
    tick(n % PUT_BATCH)
    t1 = time.perf_counter()
    expect = 0
    pending = 0
    for _ in range(n):
        expect = check_page([q.get(block=False)], expect)
        pending += 1
        if pending == PUT_BATCH or expect == n:
            for _ack in range(pending):  # one task_done per get; the first of a run saves the info file
                q.task_done()
            tick(pending)
            pending = 0
    t2 = time.perf_counter()
    del q  # its __del__ closes the chunk files
    return Timing(n, t1 - t0, t2 - t1)


STORES: tuple[Store, ...] = (
    Store(
        "persisting-sync",
        "persisting Queue",
        'durability="sync" (default; one fdatasync per put_batch), put_batch of 1,000, flush(), get pages of 10,000',
        False,
        persisting_runner("sync"),
    ),
    Store(
        "persisting-process",
        "persisting Queue",
        'durability="process" (write(2) only), put_batch of 1,000, flush(), get pages of 10,000',
        False,
        persisting_runner("process"),
    ),
    Store(
        "persisting-sync-b1000",
        "persisting Queue",
        'durability="sync", batch_size=1000 (a background flush per 1,000 rows instead of per 100), otherwise as above',
        False,
        persisting_runner("sync", 1000),
    ),
    Store(
        "sqlite-batch",
        "persistqueue.SQLiteQueue",
        "auto_commit=False, task_done() every 1,000 put/get (1.1.0 still commits each put; gets only move a cursor)",
        True,
        sqlite_runner(False),
    ),
    Store(
        "sqlite-auto",
        "persistqueue.SQLiteQueue",
        "auto_commit=True (a commit per put, a delete and commit per get)",
        True,
        sqlite_runner(True),
    ),
    Store(
        "file",
        "persistqueue.Queue",
        "file queue, chunksize=100 (default: fsync per chunk), autosave=False, task_done() per get, "
        "acknowledged in runs of 1,000",
        True,
        file_queue_run,
    ),
)
REFERENCE = "sqlite-batch"


def probe(store: Store, records: Records, path: Path) -> Timing:
    """A small untimed-for-the-table run used to project a peer's time at a larger N."""
    return store.run(records, path, _noop)
