"""A take answered with its data (get_batch through the broker) while a clear of its samples lands: the answer
holds the samples still there, with their data, instead of failing. Driven in-process on the real take handler,
TensorMemory and Topic, with the clear injected at the moment the race needs (during the take's first await)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import msgspec
import pytest

from broker.requests.context import Call
from broker.requests.take import take
from broker.tensor_memory import TensorMemory
from persisting.engine import Topic, TopicConfig
from persisting.storage import LanceBackend
from persisting.wire import codec
from persisting.wire.requests import Take


@pytest.mark.parametrize("when", ["describe", "read"])
def test_get_batch_drops_a_sample_cleared_while_it_was_read(tmp_path: Path, when: str) -> None:
    async def main() -> None:
        topic = Topic("race", tmp_path, TopicConfig(durability="process"), LanceBackend)
        await topic.open()
        memory = TensorMemory(tmp_path, 0, topics=lambda: [topic])
        services = SimpleNamespace(memory=memory)
        try:
            batch = codec.encode_batch([{"v": k} for k in range(8)], topic.kinds)
            await topic.append(batch, "p", codec.pack(batch.rows))
            doomed, cleared = 2, False
            original = topic.describe if when == "describe" else topic.sample_rows

            async def clear_first(*args: Any, **kwargs: Any) -> Any:
                nonlocal cleared
                if not cleared:  # another client's clear, run while this take awaits
                    cleared = True
                    assert await topic.clear("p", [doomed]) == 1
                return await original(*args, **kwargs)

            setattr(topic, when if when == "describe" else "sample_rows", clear_first)
            args = Take(
                topic="race", config=msgspec.Raw(b"\x80"), partition="p", task="t", batch_size=4, fields=["v"], key="k1"
            )
            reply = await take(services, Call(1, "take", args, topic_or_none=topic))  # type: ignore[arg-type]
            indexes, _described, result = reply.result.indexes, reply.result.described, reply.result.data
            rows = msgpack.unpackb(reply.buffers[0], raw=False)
            assert cleared and doomed not in indexes
            assert indexes == [0, 1, 3]  # taken with 2, which was cleared before its data was read
            assert [r["v"] for r in rows] == indexes and result.kinds == {"v": "int"}
        finally:
            await memory.close()
            await topic.close()

    asyncio.run(main())
