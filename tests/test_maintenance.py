"""Compaction and old-version cleanup run on their own and never change what a reader sees."""

from __future__ import annotations

import asyncio
from pathlib import Path

from persisting import Queue


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
                await q._topic._maintain()  # type: ignore[union-attr]  # what the background flusher runs
            bucket = (await q.stats())["buckets"][0]
            assert bucket["fragments"] <= 8, bucket
            assert [r["id"] for r in await q.get(limit=1000)] == list(range(600))
            assert [r["id"] for r in await q.get(limit=5, offset=333)] == list(range(333, 338))
        manifests = list((store / "m" / "bucket-0.lance" / "_versions").glob("*.manifest"))
        assert len(manifests) <= 5, len(manifests)
        async with Queue("m", storage_path=store, num_buckets=1) as q:
            assert [r["id"] for r in await q.get(limit=1000)] == list(range(600))

    asyncio.run(main())
