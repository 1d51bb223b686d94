"""PersistingBackend: LanceBackend plus operation counters and timings (``enable_metrics``)."""

from __future__ import annotations

import time
from typing import Any

from .lance_backend import LanceBackend


class PersistingBackend(LanceBackend):
    def __init__(
        self,
        bucket_id: int,
        storage_path: str,
        batch_size: int = 100,
        *,
        enable_metrics: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(bucket_id, storage_path, batch_size, **kwargs)
        self.enable_metrics = enable_metrics
        self._m: dict[str, float] = {
            "puts": 0,
            "records_put": 0,
            "gets": 0,
            "records_read": 0,
            "flushes": 0,
            "flush_seconds": 0.0,
            "get_seconds": 0.0,
        }

    async def put_batch(self, records: list[dict[str, Any]]) -> None:
        await super().put_batch(records)
        if self.enable_metrics:
            self._m["puts"] += 1
            self._m["records_put"] += len(records)

    async def get(self, limit: int, offset: int) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        rows = await super().get(limit, offset)
        if self.enable_metrics:
            self._m["gets"] += 1
            self._m["records_read"] += len(rows)
            self._m["get_seconds"] += time.perf_counter() - t0
        return rows

    async def flush(self) -> None:
        t0 = time.perf_counter()
        commits = self.commits
        await super().flush()
        if self.enable_metrics and self.commits != commits:
            self._m["flushes"] += 1
            self._m["flush_seconds"] += time.perf_counter() - t0

    async def get_metrics(self) -> dict[str, float]:
        return dict(self._m)

    async def stats(self) -> dict[str, Any]:
        out = await super().stats()
        if self.enable_metrics:
            out["metrics"] = dict(self._m)
        return out
