"""A put_batch retried with the same key is stored once, also across a restart (the key is in its log frame)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from persisting import codec
from persisting.engine import Topic, TopicConfig
from persisting.queue import LanceBackend


def test_same_key_is_stored_once_across_reopen(store: Path) -> None:
    async def attempt(flush: bool) -> tuple[int, int, int]:
        topic = Topic("idem", store, TopicConfig(batch_size=1), LanceBackend)
        await topic.open()
        try:
            batch = codec.encode_batch([{"id": 1, "payload": [1, 2]}], topic.kinds)
            result = await topic.append(batch, "default", codec.pack(batch.rows), key="retry-me")
            again = await topic.append(batch, "default", codec.pack(batch.rows), key="retry-me")
            assert again == result
            if flush:
                await topic.flush()
            return (*result, topic.count())
        finally:
            await topic.close()

    async def main() -> None:
        assert await attempt(flush=False) == (0, 1, 1)
        assert await attempt(flush=True) == (0, 1, 1)  # after a restart: same answer, nothing added
        assert await attempt(flush=False) == (0, 1, 1)

    asyncio.run(main())
