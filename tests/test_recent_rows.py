"""Rows a flush just moved into the backends are read from memory (engine/tail.py, the recent chunks): the same
records as from the backends, cleared ones skipped, and once they are older than the bound, from the backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persisting import SyncQueue
from persisting.engine import buckets as buckets_module
from persisting.engine import tail as tail_module


@pytest.fixture
def backend_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The ranges read from the backends (the real reads still run)."""
    seen: list[tuple[int, int]] = []
    real = buckets_module.Buckets.read

    async def read(self: Any, lo: int, hi: int, described: bool = False) -> list[dict[str, Any]]:
        seen.append((lo, hi))
        return await real(self, lo, hi, described)

    monkeypatch.setattr(buckets_module.Buckets, "read", read)
    return seen


def _fill(q: SyncQueue, batches: int) -> list[dict[str, Any]]:
    records = [{"id": i, "text": f"r{i}" * (i % 5), "blob": bytes([i % 256]) * (i % 7)} for i in range(batches * 50)]
    for b in range(batches):
        q.put_batch(records[b * 50 : (b + 1) * 50])
    q.flush()
    return records


def test_recently_flushed_rows_come_from_memory(tmp_path: Path, backend_reads: list[tuple[int, int]]) -> None:
    with SyncQueue("recent", tmp_path, durability="process") as q:
        records = _fill(q, 4)
        got = q.get(limit=200, offset=0)
        assert got == records
        assert q.get(limit=30, offset=40) == records[40:70]  # across two put batches
        assert backend_reads == []
        q.clear([41, 42])
        assert q.get(limit=30, offset=40) == [records[40], *records[43:70]]
        assert backend_reads == []


def test_older_rows_than_the_bound_come_from_the_backends(
    tmp_path: Path, backend_reads: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail_module, "RECENT_ROWS", 100)
    with SyncQueue("recent", tmp_path, durability="process") as q:
        records = _fill(q, 4)
        assert q.get(limit=200, offset=0) == records  # the first 100 from the backends, the rest from memory
        assert backend_reads == [(0, 200)]
        backend_reads.clear()
        assert q.get(limit=100, offset=100) == records[100:]
        assert backend_reads == []
    with SyncQueue("recent", tmp_path, durability="process") as q:  # reopened: nothing recent yet
        assert q.get(limit=200, offset=0) == records
        assert backend_reads == [(0, 200)]
