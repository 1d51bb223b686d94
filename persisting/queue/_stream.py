"""get_stream for backends, written once on top of their get() and a change notification."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

STREAM_CHUNK_ROWS = 100


class StreamMixin:
    """Gives a backend ``get_stream`` from its ``get`` and ``total_count``; writers call ``_notify()``."""

    _changed: asyncio.Event | None = None

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def get(self, limit: int, offset: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def total_count(self) -> int:
        raise NotImplementedError

    async def get_stream(
        self, limit: int, offset: int, wait: bool = False, timeout: float | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]:
        pos, remaining = offset, limit
        while remaining > 0:
            if pos >= self.total_count():
                if not wait:
                    return
                if self._changed is None:
                    self._changed = asyncio.Event()
                self._changed.clear()
                if pos < self.total_count():
                    continue
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout)
                except TimeoutError:
                    return
                continue
            batch = await self.get(min(remaining, STREAM_CHUNK_ROWS), pos)
            if not batch:
                return
            yield batch
            pos += len(batch)
            remaining -= len(batch)
