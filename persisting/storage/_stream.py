"""get_stream for backends, written once on top of their get() and a change notification.

A backend owns a ``RowStream`` (composition: it is given the backend's ``get`` and ``total_count``), returns
``self._stream.rows(...)`` from its ``get_stream``, and calls ``self._stream.notify()`` whenever rows arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

STREAM_CHUNK_ROWS = 100


class RowStream:
    def __init__(
        self,
        get: Callable[[int, int], Awaitable[list[dict[str, Any]]]],
        total_count: Callable[[], int],
    ) -> None:
        self._get = get
        self._total_count = total_count
        self._changed: asyncio.Event | None = None  # made by the first waiting stream, on its loop

    def notify(self) -> None:
        """Rows arrived: wake the streams waiting for them."""
        if self._changed is not None:
            self._changed.set()

    async def rows(
        self, limit: int, offset: int, wait: bool = False, timeout: float | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Up to ``limit`` rows from ``offset`` in chunks; with ``wait``, waits up to ``timeout`` s per wait."""
        pos, remaining = offset, limit
        while remaining > 0:
            if pos >= self._total_count():
                if not wait:
                    return
                if self._changed is None:
                    self._changed = asyncio.Event()
                self._changed.clear()
                if pos < self._total_count():
                    continue
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout)
                except TimeoutError:
                    return
                continue
            batch = await self._get(min(remaining, STREAM_CHUNK_ROWS), pos)
            if not batch:
                return
            yield batch
            pos += len(batch)
            remaining -= len(batch)
