"""Compaction and old-version cleanup run on their own and never change what a reader sees."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from persisting import Queue
from persisting.client import _loop
from persisting.storage import LanceBackend


def test_compaction_and_cleanup_keep_fragments_and_versions_bounded(store: Path) -> None:
    options = {
        "compact_min_fragments": 4,
        "target_rows_per_fragment": 200,
        "retain_seconds": 0.0,
        "cleanup_interval_seconds": 0.0,
    }

    async def main() -> None:
        async with Queue("m", storage_path=store, num_buckets=1, batch_size=10**6, backend_options=options) as q:
            for i in range(60):
                await q.put_batch([{"id": i * 10 + k, "v": str(k)} for k in range(10)])
                await q.flush()
                await _loop.call(q._handle.opened.engine_topic.maintain())  # type: ignore[union-attr]  # as the background flusher does
            bucket = (await q.stats())["buckets"][0]
            assert bucket["fragments"] <= 8, bucket
            assert [r["id"] for r in await q.get(limit=1000)] == list(range(600))
            assert [r["id"] for r in await q.get(limit=5, offset=333)] == list(range(333, 338))
        manifests = list((store / "m" / "bucket-0.lance" / "_versions").glob("*.manifest"))
        assert len(manifests) <= 5, len(manifests)
        async with Queue("m", storage_path=store, num_buckets=1) as q:
            assert [r["id"] for r in await q.get(limit=1000)] == list(range(600))

    asyncio.run(main())


class TracedMaintenance(LanceBackend):
    """Records when the worker-thread part of maintenance starts and ends."""

    started = threading.Event()
    ended: ClassVar[list[float]] = []

    def _maintain(self, ds: Any, small: int, cleanup: bool) -> Any:
        TracedMaintenance.started.set()
        try:
            time.sleep(0.05)  # widen the window in which close() could return too early
            return super()._maintain(ds, small, cleanup)
        finally:
            TracedMaintenance.ended.append(time.perf_counter())


def test_close_waits_for_background_maintenance(store: Path) -> None:
    options = {"compact_min_fragments": 2, "cleanup_interval_seconds": 0.0, "retain_seconds": 0.0}

    async def main() -> float:
        q = Queue("c", storage_path=store, batch_size=100, backend=TracedMaintenance, backend_options=options)
        i = 0
        while not TracedMaintenance.started.is_set():
            await q.put_batch([{"id": i + k} for k in range(100)])
            i += 100
            await asyncio.sleep(0)
        await q.aclose()
        return time.perf_counter()

    closed_at = asyncio.run(main())
    assert TracedMaintenance.ended and max(TracedMaintenance.ended) <= closed_at
    # the lock is free and nothing writes any more: the folder no longer changes
    before = sorted(p.name for p in (store / "c").rglob("*"))
    time.sleep(0.3)
    assert sorted(p.name for p in (store / "c").rglob("*")) == before


def test_explicit_flushes_alone_still_compact(store: Path) -> None:
    options = {"compact_min_fragments": 4, "target_rows_per_fragment": 10_000}

    async def main() -> None:
        async with Queue("e", storage_path=store, num_buckets=1, batch_size=10**9, backend_options=options) as q:
            for i in range(40):
                await q.put_batch([{"id": i * 10 + k} for k in range(10)])
                await q.flush()
            for _ in range(100):
                if (await q.stats())["buckets"][0]["fragments"] < 10:
                    break
                await asyncio.sleep(0.02)
            assert (await q.stats())["buckets"][0]["fragments"] < 10
            assert [r["id"] for r in await q.get(1000)] == list(range(400))

    asyncio.run(main())
