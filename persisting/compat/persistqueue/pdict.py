"""persist-queue's ``PDict``: a persistent dict (get, set, delete, ``in``, ``len``; no iteration, as there).
Each write appends a record (key, value bytes or a tombstone); the value of a key is its latest record, read
by every process in the same global index order."""

from __future__ import annotations

from typing import Any, NoReturn

from .. import _engine
from ._store import Store, storage_root
from ._twin import CLOSE_AT_EXIT_S, close_once, opened
from .serializers import pickle as default_serializer
from .sqlqueue import database_file


class PDict(dict):
    def __init__(self, path: str, name: str, multithreading: bool = False, *, broker: str | None = None) -> None:
        super().__init__()
        self.path = path
        self.name = name
        self._store = Store(storage_root(database_file(path, None)), f"dict_{name}", default_serializer, broker=broker)
        self._values: dict[str, bytes | None] = {}
        self._seen = 0

    def _refresh(self) -> None:
        _engine.run(self._catch_up())
        opened(self)

    async def _catch_up(self) -> None:
        await self._store.open()
        while True:
            rows, end = await _engine.read_window(self._store.queue, 10_000, self._seen)
            if end <= self._seen:
                return
            for record in rows:
                self._values[str(record["k"])] = record.get("v")
            self._seen = end

    def _write(self, key: Any, value: bytes | None) -> None:
        async def write() -> None:
            await self._store.open()
            await self._store.queue.put_batch([{"k": str(key), "v": value}])

        _engine.run(write())

    def __setitem__(self, key: Any, value: Any) -> None:
        self._write(key, self._store.serializer.dumps(value))

    def __getitem__(self, key: Any) -> Any:
        self._refresh()
        blob = self._values.get(str(key))
        if blob is None:
            raise KeyError(f"Key: {key} not exists.")
        return self._store.serializer.loads(blob)

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        self._refresh()
        return self._values.get(str(key)) is not None

    def __delitem__(self, key: Any) -> None:
        self._write(key, None)

    def __len__(self) -> int:
        self._refresh()
        return sum(1 for v in self._values.values() if v is not None)

    def close(self) -> None:
        close_once(self, self._store.close)

    def __del__(self) -> None:
        if "_store" in self.__dict__:
            close_once(self, self._store.close, CLOSE_AT_EXIT_S)

    def _unsupported(self, *args: Any) -> NoReturn:
        raise NotImplementedError("Not supported.")

    __iter__ = keys = iterkeys = values = itervalues = items = iteritems = _unsupported
