"""ReadGate: reads that map global indexes to positions in the backends share it; a purge takes it alone.

Deleting rows from a Lance dataset moves the positions of every row after them, so a read planned on the old
positions must not meet the new dataset. Reads enter through ``reading()`` (any number at once); ``alone()``
closes the gate to new reads, waits for those in flight, and opens it again when the purge is done. Everything
runs on the engine's loop, so plain counters suffice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class ReadGate:
    def __init__(self) -> None:
        self._readers = 0
        self._idle = asyncio.Event()  # no read in flight
        self._idle.set()
        self._open = asyncio.Event()  # new reads may start
        self._open.set()

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[None]:
        while not self._open.is_set():
            await self._open.wait()
        self._readers += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._readers -= 1
            if not self._readers:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        self._open.clear()
        try:
            await self._idle.wait()
            yield
        finally:
            self._open.set()
