"""Keyed samples: one request per call, answered by the engine's key index (``Topic.keys``).

kv_put     partition, keys, tags (a dict per key, or nil), key (idempotency); with a rows buffer, kinds and
           count: the keys' fields (copied over the socket; through the arena it is ``put_tensors`` with
           ``kv``, see ``put``). -> [first, count, [sample per key], describe of those samples]
kv_get     partition, keys, fields (nil: those every key has), read (bool): the keys' samples, and their data
           in the same reply when asked (as ``get_data``: arena views or rows).
           -> [[sample or nil per key], describe of the found ones, [fields read], data or nil]
kv_list    partition (nil: every one) -> {partition: {key: tags}}
kv_clear   partition, keys -> how many samples were cleared
kv_names   partition, indexes -> [key or nil per sample]
"""

from __future__ import annotations

from typing import Any

from persisting.engine import ArenaPayload, Topic, shared_fields
from persisting.errors import ProtocolError
from persisting.wire import codec
from persisting.wire.protocol import Reply
from persisting.wire.replies import KeyedRange, KeyedSamples
from persisting.wire.requests import KeyedPut, KvGet, KvKeys, KvList, KvNames, KvPut

from . import reads
from .context import Call, Services
from .records import encoded_rows


async def put(
    topic: Topic,
    kv: KeyedPut,
    batch: codec.EncodedBatch,
    partition: str,
    rows_blob: bytes,
    key: str | None,
    arena: ArenaPayload | None,
) -> tuple[int, int, tuple[list[int], list[Any]]]:
    """A keyed put's data (``put_tensors`` with ``kv``); returns the append's (first, count) and what the reply
    adds: (sample per key, describe of them)."""
    first, n, indexes = await topic.keys.put(partition, kv.keys, kv.tags, batch, rows_blob, key, arena)
    return first, n, (indexes, await topic.describe(indexes))


async def recalled(topic: Topic, kv: KeyedPut, partition: str) -> tuple[list[int], list[Any]]:
    """What a keyed put's reply adds when the put was re-sent and its first attempt is stored (its idempotency key
    recalled): the keys' samples now and their description. Its tags are merged again: the first attempt may have
    died between its data and its tags (merging the same tags twice changes nothing)."""
    _, _, indexes = await topic.keys.put(partition, kv.keys, kv.tags)
    return indexes, await topic.describe(indexes)


async def kv_put(services: Services, call: Call[KvPut]) -> Reply:
    args, topic = call.args, call.topic
    batch, blob = None, None
    if call.buffers:
        if args.kinds is None or args.count is None:
            raise ProtocolError("kv_put with rows needs kinds (a map) and count (an int)")
        batch, blob = encoded_rows(call.buffers, args.kinds, args.count, "kv_put"), call.buffers[0]
    first, n, indexes = await topic.keys.put(args.partition, args.keys, args.tags, batch, blob, args.key)
    return call.ok(KeyedRange(first, n, indexes, await topic.describe(indexes)))


async def kv_get(services: Services, call: Call[KvGet]) -> Reply:
    args, topic = call.args, call.topic
    named = await topic.keys.lookup(args.partition, args.keys)
    found = [i for i in named if i is not None]
    runs = await topic.describe(found)
    shared = shared_fields(runs)
    chosen = shared if args.fields is None else [f for f in args.fields if f in shared]
    if not (args.read and found and chosen):
        return call.ok(KeyedSamples(named, runs, chosen, None))
    data, buffers = await reads.data(
        services.memory,
        topic,
        call.peer,
        found,
        chosen,
        zerocopy=args.zerocopy,
        columns_wanted=args.columns,
        checked=True,
    )
    return call.ok(KeyedSamples(named, runs, chosen, data), buffers)


async def kv_list(services: Services, call: Call[KvList]) -> Reply:
    return call.ok(await call.topic.keys.listing(call.args.partition))


async def kv_clear(services: Services, call: Call[KvKeys]) -> Reply:
    return call.ok(await call.topic.keys.clear(call.args.partition, call.args.keys))


async def kv_names(services: Services, call: Call[KvNames]) -> Reply:
    return call.ok(await call.topic.keys.names(call.args.partition, call.args.indexes))
