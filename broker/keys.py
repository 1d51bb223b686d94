"""The broker's KV operations: one request per call, answered by the engine's key index (``Topic.keys``).

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

from typing import TYPE_CHECKING, Any

import msgpack

from persisting.engine import ArenaPayload, Topic, shared_fields
from persisting.errors import ProtocolError
from persisting.wire import codec, row_checks
from persisting.wire.protocol import Reply, Request, arg

from .extents import Peer
from .givebacks import int_list

if TYPE_CHECKING:
    from .plane import TensorPlane as Plane

OPS = frozenset({"kv_put", "kv_get", "kv_list", "kv_clear", "kv_names"})


def _keys(req: Request) -> list[str]:
    keys = req.args.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ProtocolError("kv keys must be a list of str")
    return keys


def _tags(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ProtocolError("kv tags must be a list of {key: value} (one per key) or nil")
    return raw


async def put(
    topic: Topic,
    kv: Any,
    batch: codec.EncodedBatch,
    partition: str,
    rows_blob: bytes,
    key: str | None,
    arena: ArenaPayload | None,
) -> tuple[int, int, list[Any]]:
    """A keyed put's data (``put_tensors`` with ``kv``: ``{"keys": [...], "tags": [...] or nil}``); returns the
    append's (first, count) and what the reply adds: [sample per key, describe of them]."""
    if not isinstance(kv, dict):
        raise ProtocolError("put_tensors kv must be {keys, tags}")
    keys = kv.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ProtocolError("kv keys must be a list of str")
    first, n, indexes = await topic.keys.put(partition, keys, _tags(kv.get("tags")), batch, rows_blob, key, arena)
    return first, n, [indexes, await topic.describe(indexes)]


async def recalled(topic: Topic, kv: Any, partition: str) -> list[Any]:
    """What a keyed put's reply adds when the put was re-sent and its first attempt is stored (its idempotency key
    recalled): the keys' samples now and their description. Its tags are merged again: the first attempt may have
    died between its data and its tags (merging the same tags twice changes nothing)."""
    if not isinstance(kv, dict):
        raise ProtocolError("put_tensors kv must be {keys, tags}")
    keys = kv.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ProtocolError("kv keys must be a list of str")
    _, _, indexes = await topic.keys.put(partition, keys, _tags(kv.get("tags")))
    return [indexes, await topic.describe(indexes)]


async def handle(req: Request, topic: Topic, plane: Plane, peer: Peer | None) -> Reply:
    if req.op == "kv_put":
        partition, keys, tags = arg(req, "partition", str), _keys(req), _tags(req.args.get("tags"))
        key = req.args.get("key")
        if key is not None and not isinstance(key, str):
            raise ProtocolError("kv_put key must be a str or nil")
        batch, blob = None, None
        if req.buffers:
            kinds, count = arg(req, "kinds", dict), arg(req, "count", int)
            try:
                rows = msgpack.unpackb(req.buffers[0], raw=False, use_list=True)
            except Exception as exc:
                raise ProtocolError(f"kv_put rows are not valid msgpack: {exc}") from exc
            batch, blob = codec.EncodedBatch(row_checks.check_rows(rows, kinds, count), kinds), req.buffers[0]
        first, n, indexes = await topic.keys.put(partition, keys, tags, batch, blob, key)
        return Reply(req.id, True, [first, n, indexes, await topic.describe(indexes)])
    if req.op == "kv_get":
        partition, keys = arg(req, "partition", str), _keys(req)
        wanted = req.args.get("fields")
        if wanted is not None and (not isinstance(wanted, list) or not all(isinstance(f, str) for f in wanted)):
            raise ProtocolError("kv_get fields must be a list of str or nil")
        named = await topic.keys.lookup(partition, keys)
        found = [i for i in named if i is not None]
        runs = await topic.describe(found)
        shared = shared_fields(runs)
        chosen = shared if wanted is None else [f for f in wanted if f in shared]
        if not (req.args.get("read") and found and chosen):
            return Reply(req.id, True, [named, runs, chosen, None])
        req.args["fields"] = chosen
        data = await plane.get(req, topic, peer, found)
        return Reply(req.id, True, [named, runs, chosen, data.result], buffers=data.buffers)
    if req.op == "kv_list":
        partition = req.args.get("partition")
        if partition is not None and not isinstance(partition, str):
            raise ProtocolError("kv_list partition must be a str or nil")
        return Reply(req.id, True, await topic.keys.listing(partition))
    if req.op == "kv_clear":
        return Reply(req.id, True, await topic.keys.clear(arg(req, "partition", str), _keys(req)))
    if req.op == "kv_names":
        indexes = int_list(req.args.get("indexes"), "indexes")
        return Reply(req.id, True, await topic.keys.names(arg(req, "partition", str), indexes))
    raise ProtocolError(f"unknown operation {req.op!r}")
