"""A persist-queue serializer, whichever half it has: ``dumps``/``loads`` or only ``dump(value, fp)``/``load(fp)``,
the file pair as coroutines too (persist-queue's async queues accept those). Like persist-queue, the file queues
use the file pair and the SQLite family the bytes pair when a serializer has both. Runs in the client process only:
the broker stores and hands out bytes, it never unpickles."""

from __future__ import annotations

import asyncio
import io
from typing import Any

from persisting.errors import InvalidSerializerError


class Serializer:
    def __init__(self, module: Any, prefer_file: bool = False) -> None:
        has_bytes = callable(getattr(module, "dumps", None)) and callable(getattr(module, "loads", None))
        has_file = callable(getattr(module, "dump", None)) and callable(getattr(module, "load", None))
        if not (has_bytes or has_file):
            raise InvalidSerializerError(
                f"serializer {module!r} has neither dumps(value)/loads(bytes) nor dump(value, fp)/load(fp); pass "
                "one of persistqueue.serializers' modules (pickle, json, msgpack, cbor2) or an object with them"
            )
        self.module = module
        self._bytes = has_bytes and not (prefer_file and has_file)
        self._async_dump = not self._bytes and asyncio.iscoroutinefunction(module.dump)
        self._async_load = not self._bytes and asyncio.iscoroutinefunction(module.load)

    def dumps(self, value: Any, sort_keys: bool = False) -> bytes:
        if self._bytes:
            return bytes(self.module.dumps(value, sort_keys=sort_keys) if sort_keys else self.module.dumps(value))
        buffer = io.BytesIO()
        if sort_keys:
            self.module.dump(value, buffer, sort_keys=True)
        else:
            self.module.dump(value, buffer)
        return buffer.getvalue()

    def loads(self, blob: bytes) -> Any:
        if self._bytes:
            return self.module.loads(blob)
        return self.module.load(io.BytesIO(blob))

    async def adumps(self, value: Any, sort_keys: bool = False) -> bytes:
        if not self._async_dump:
            return self.dumps(value, sort_keys)
        buffer = io.BytesIO()
        await self.module.dump(value, buffer)
        return buffer.getvalue()

    async def aloads(self, blob: bytes) -> Any:
        if not self._async_load:
            return self.loads(blob)
        return await self.module.load(io.BytesIO(blob))
