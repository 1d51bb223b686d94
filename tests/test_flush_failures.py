"""A flush that fails (before or after its Lance commit lands) is retried without loss or duplicates.

Lance cannot be made to fail on demand here (tests run as root, so permissions do not stop it), so a
LanceBackend subclass raises around the real Lance append: once before the commit, once after it landed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest

from persisting import Queue, StorageError
from persisting.queue import LanceBackend


class FailingOnce(LanceBackend):
    """Bucket 1 fails its first append: ``mode`` says whether the real commit happened first."""

    mode: ClassVar[str] = "before"
    failed: ClassVar[set[str]] = set()

    def _append(self, table: Any) -> Any:
        key = f"{self.uri}:{self.mode}"
        if self.bucket_id == 1 and key not in self.failed:
            self.failed.add(key)
            if self.mode == "after":
                super()._append(table)  # the commit lands, the writer still sees an error
            raise StorageError("injected append failure")
        return super()._append(table)


@pytest.mark.parametrize("mode", ["before", "after"])
def test_failed_flush_is_retried_exactly_once(store: Path, mode: str) -> None:
    FailingOnce.mode = mode

    async def main() -> None:
        async with Queue("f", storage_path=store, num_buckets=3, batch_size=10**6, backend=FailingOnce) as q:
            await q.put_batch([{"id": i} for i in range(30)])
            with pytest.raises(StorageError, match="injected"):
                await q.flush()
            # still readable (from the log-backed tail) and writable
            assert [r["id"] for r in await q.get(100)] == list(range(30))
            await q.put_batch([{"id": i} for i in range(30, 40)])
            await q.flush()
            assert [r["id"] for r in await q.get(100)] == list(range(40))
            assert sum(b["total_count"] for b in (await q.stats())["buckets"]) == 40
        async with Queue("f", storage_path=store, num_buckets=3, backend=FailingOnce) as q:
            assert [r["id"] for r in await q.get(100)] == list(range(40))

    asyncio.run(main())
