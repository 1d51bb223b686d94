"""InMemoryBackend: rows in a Python list. Not durable; the engine replays its log into it at every start."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ._stream import RowStream


class InMemoryBackend:
    """Keeps rows in memory. ``durable = False``: with a ``Queue`` the write-ahead log is never trimmed and
    is replayed at start, so the queue stays durable while its log grows with the data."""

    durable = False

    def __init__(self, bucket_id: int, storage_path: str, batch_size: int = 100, **kwargs: Any) -> None:
        self.bucket_id = bucket_id
        self.storage_path = storage_path
        self._rows: list[dict[str, Any]] = []
        self._stream = RowStream(self.get, self.total_count)

    def total_count(self) -> int:
        return len(self._rows)

    async def put(self, record: dict[str, Any]) -> None:
        self._rows.append(dict(record))
        self._stream.notify()

    async def put_batch(self, records: list[dict[str, Any]]) -> None:
        self._rows.extend(dict(r) for r in records)
        self._stream.notify()

    async def get(self, limit: int, offset: int) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows[offset : offset + limit]]

    def get_stream(
        self, limit: int, offset: int, wait: bool = False, timeout: float | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]:
        return self._stream.rows(limit, offset, wait, timeout)

    async def flush(self) -> None:
        return None

    async def stats(self) -> dict[str, Any]:
        return {"bucket_id": self.bucket_id, "total_count": len(self._rows), "durable": False}
