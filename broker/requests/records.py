"""Record requests on a topic: ``put_batch``, ``read`` (a long-poll with ``wait``), ``wait``, ``flush``, ``stats``,
``count``; and ``encoded_rows``, the rows buffer of any put, checked (riders.py and kv.py use it too)."""

from __future__ import annotations

from typing import Any

import msgpack

from persisting.errors import ProtocolError
from persisting.wire import codec, protocol, row_checks
from persisting.wire.protocol import Reply
from persisting.wire.replies import Range, Read
from persisting.wire.requests import PutBatch, TopicOnly, Wait
from persisting.wire.requests import Read as ReadArgs

from .context import Call, Services


async def put_batch(services: Services, call: Call[PutBatch]) -> Reply:
    """Rows appended to the topic."""
    args = call.args
    batch = encoded_rows(call.buffers, args.kinds, args.count, "put_batch")
    first, n = await call.topic.append(batch, args.partition, call.buffers[0], args.key, of=args.of)
    return call.ok(Range(first, n))


def encoded_rows(buffers: list[bytes], kinds: dict[str, Any], count: int, what: str) -> codec.EncodedBatch:
    """The request's one buffer of msgpack rows, checked against ``kinds`` and ``count`` (``what``: the put's name
    in errors: ``put_batch``, or a put riding on another request, riders.py)."""
    if len(buffers) != 1:
        raise ProtocolError(f"{what} needs one rows buffer")
    try:
        rows = msgpack.unpackb(buffers[0], raw=False, use_list=True)
    except Exception as exc:
        raise ProtocolError(f"{what} rows are not valid msgpack: {exc}") from exc
    return codec.EncodedBatch(row_checks.check_rows(rows, kinds, count), kinds)


async def read(services: Services, call: Call[ReadArgs]) -> Reply:
    args, topic = call.args, call.topic
    offset, limit = args.offset, args.limit
    wait = None if args.wait is None else max(0.0, args.wait)
    rows, kinds, end = await topic.read_window(offset, limit)
    # A read with "wait" is a long-poll: a consumer at the end of the data gets its next page in one
    # round trip instead of read, wait, read. "waited" tells the client this broker honoured it.
    if (
        end <= offset
        and wait is not None
        and limit > 0
        and await topic.wait_beyond(offset, min(wait, protocol.WAIT_SLICE_SECONDS))
    ):
        rows, kinds, end = await topic.read_window(offset, limit)
    return call.ok(Read(kinds, topic.count(), wait is not None, end), [codec.pack(rows)])


async def wait(services: Services, call: Call[Wait]) -> Reply:
    timeout = call.args.timeout
    limit = protocol.WAIT_SLICE_SECONDS if timeout is None else min(max(0.0, timeout), protocol.WAIT_SLICE_SECONDS)
    return call.ok(await call.topic.wait_beyond(call.args.index, limit))


async def flush(services: Services, call: Call[TopicOnly]) -> Reply:
    await call.topic.flush()
    return call.ok(None)


async def stats(services: Services, call: Call[TopicOnly]) -> Reply:
    return call.ok(await call.topic.stats())


async def count(services: Services, call: Call[TopicOnly]) -> Reply:
    return call.ok(call.topic.count())
