"""Running a request inline until it first has to wait, then as a task from where it stopped.

Most requests (hello, count, a read of buffered rows, a put with durability="process") finish without ever
suspending, so they cost no task; one that suspends continues as a task (what Python 3.12's eager tasks do).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Generator
from typing import Any

import msgpack


def start(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro``'s first step now; a task for the rest if it suspended (None: it finished). Raises what the
    first step raised."""
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_finish(Resumed(coro, first)))


class Resumed:
    """An awaitable that carries on a coroutine whose first step already ran and yielded ``first``."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, None]:
        coro, value = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield value  # the Task driving us sees exactly what the coroutine yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation (or anything thrown in) goes on into the coroutine
                try:
                    value = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    value = coro.send(sent)
                except StopIteration:
                    return


async def _finish(resumed: Resumed) -> None:
    await resumed


def guess_id(body: list[bytes]) -> int:
    """The request id of a message that failed to decode, when it can be read at all (else 0)."""
    with contextlib.suppress(Exception):
        env = msgpack.unpackb(body[0], raw=False)
        if isinstance(env, dict) and isinstance(env.get("id"), int):
            return int(env["id"])
    return 0
