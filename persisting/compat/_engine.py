"""Every use of persisting internals by the compat layers, in one place (the rest imports public names only).

- ``run``: runs a coroutine on the engine's loop and blocks for it, as ``SyncQueue`` does: a compat queue's
  blocking twin then costs one thread hop per call, and the ``Queue`` calls inside it run without one.
- ``read_window``: records from a global index on, with where the window ended (``Queue.get`` does not say,
  and a window holding cleared samples' rows returns fewer rows than it spans).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from persisting import Queue
from persisting.client import _loop

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return _loop.run(coro)


async def read_window(queue: Queue, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    return await queue._read(limit, offset)
