"""A put_batch retried with the same key is stored once, also across a restart (the key is in its log frame)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from persisting.engine import flushing
from persisting.engine.config import TopicConfig
from persisting.engine.topic import Topic
from persisting.storage import LanceBackend
from persisting.wire import codec


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


def test_key_survives_when_its_flushed_segment_has_rotated(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flushed log segments stay for the retry window: a retry after a restart is recognized even when the
    frame carrying its key is already in Lance and its segment was rotated out."""
    monkeypatch.setattr(flushing, "ROTATE_AT_BYTES", 1)  # a new segment at every flush

    async def main() -> None:
        topic = Topic("rot", store, TopicConfig(batch_size=10**6), LanceBackend)
        await topic.open()
        batch = codec.encode_batch([{"id": 1}], topic.kinds)
        first = await topic.append(batch, "default", codec.pack(batch.rows), key="k1")
        for i in range(3):  # more flushes: the segment holding k1 becomes droppable but for its age
            more = codec.encode_batch([{"id": 2 + i}], topic.kinds)
            await topic.append(more, "default", codec.pack(more.rows))
            await topic.flush()
        await topic.close()
        reopened = Topic("rot", store, TopicConfig(batch_size=10**6), LanceBackend)
        await reopened.open()
        try:
            assert await reopened.append(batch, "default", codec.pack(batch.rows), key="k1") == first
            assert reopened.count() == 4
        finally:
            await reopened.close()

    asyncio.run(main())
