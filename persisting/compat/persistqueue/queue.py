"""persist-queue's file ``Queue`` (blocking, thread-safe): the twin of ``AsyncQueue``, run on the engine loop."""

from __future__ import annotations

from typing import Any

from .. import _engine
from ._filequeue import AsyncFile
from ._twin import CLOSE_AT_EXIT_S, close_once, opened, twin
from .serializers import pickle as default_serializer


@twin(AsyncFile, ("put", "put_nowait", "get", "get_nowait", "task_done", "join", "qsize", "empty", "full"))
class Queue:
    def __init__(
        self,
        path: str,
        maxsize: int = 0,
        chunksize: int = 100,
        tempdir: str | None = None,
        serializer: Any = default_serializer,
        autosave: bool = False,
        *,
        broker: str | None = None,
        durability: str = "process",
    ) -> None:
        self._impl = AsyncFile(
            path, maxsize, chunksize, tempdir, serializer, autosave, broker=broker, durability=durability
        )
        _engine.run(self._impl._start())
        opened(self)

    def __getattr__(self, name: str) -> Any:
        if name in ("path", "maxsize", "chunksize", "tempdir", "serializer", "autosave", "unfinished_tasks"):
            return getattr(self._impl, name)
        raise AttributeError(name)

    def close(self) -> None:
        close_once(self, self._impl.close)

    def __del__(self) -> None:
        if "_impl" in self.__dict__:
            close_once(self, self._impl.close, CLOSE_AT_EXIT_S)
