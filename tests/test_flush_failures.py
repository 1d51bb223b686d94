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
from persisting.storage import LanceBackend


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


class FailingWithItsReopen(LanceBackend):
    """Bucket 1's append fails once, and so does the reopen that follows it (the disk is still failing)."""

    armed: ClassVar[bool] = True
    reopen_failures: ClassVar[int] = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if FailingWithItsReopen.reopen_failures:
            FailingWithItsReopen.reopen_failures -= 1
            raise StorageError("injected reopen failure")
        super().__init__(*args, **kwargs)

    def _append(self, table: Any) -> Any:
        if self.bucket_id == 1 and FailingWithItsReopen.armed:
            FailingWithItsReopen.armed = False
            FailingWithItsReopen.reopen_failures = 1
            raise StorageError("injected append failure")
        return super()._append(table)


def test_a_failed_flush_whose_reopen_fails_too_stores_nothing_twice(store: Path) -> None:
    """The backend object of the failed write still held the rows it could not append; a retry through it stored
    them twice (and the bucket's index column no longer matched its rows). It is reopened before its next use."""
    FailingWithItsReopen.armed, FailingWithItsReopen.reopen_failures = True, 0

    async def main() -> None:
        opts: dict[str, Any] = {"num_buckets": 3, "batch_size": 10**6, "backend": FailingWithItsReopen}
        async with Queue("r", storage_path=store, **opts) as q:
            await q.put_batch([{"id": i} for i in range(30)])
            with pytest.raises(StorageError, match="injected"):
                await q.flush()
            await q.put_batch([{"id": i} for i in range(30, 40)])
            await q.flush()
            assert [r["id"] for r in await q.get(100)] == list(range(40))
            assert sum(b["total_count"] for b in (await q.stats())["buckets"]) == 40
            await q.clear(list(range(5)))  # a purge reads the buckets' engine columns beside their index columns
            assert [r["id"] for r in await q.get(100)] == list(range(5, 40))
        async with Queue("r", storage_path=store, num_buckets=3, backend=FailingWithItsReopen) as q:
            assert [r["id"] for r in await q.get(100)] == list(range(5, 40))
            assert sum(b["total_count"] for b in (await q.stats())["buckets"]) == 35

    asyncio.run(main())


def test_a_topic_left_open_at_exit_logs_no_failed_flush_and_loses_nothing(tmp_path: Path) -> None:
    """A process that exits without closing its queue: the background flush, finding the worker threads gone,
    used to log a failure with a traceback (and retry each second while the process lasted)."""
    import subprocess
    import sys

    script = (
        "import sys\nfrom persisting import SyncQueue\n"
        "q = SyncQueue('left-open', sys.argv[1], batch_size=1)\n"
        "q.put_batch([{'id': i} for i in range(50)])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stderr and "Traceback" not in done.stderr, done.stderr

    async def main() -> None:
        async with Queue("left-open", storage_path=tmp_path) as q:
            assert [r["id"] for r in await q.get(100)] == list(range(50))

    asyncio.run(main())
