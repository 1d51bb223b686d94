"""Broker mode, keyed samples: ``RemoteKeys``, a ``remote.RemoteTopic``'s ``KeysAPI`` (topic_api.py).

One request per call (``kv_put``, ``kv_get``, ``kv_list``, ``kv_clear``, ``kv_names``; the broker's side is
``broker/requests/kv.py``). A keyed put's tensors go through the arena as any tensor put does (``keyed.put``); the rows
of one that is copied, and tags, come here. A ``kv_get`` whose views point into the arena of a broker that
restarted since is asked again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import UnknownExtentError
from ..tensors.arena import peer_id
from . import releases
from .remote_tensors import RESTART_RETRIES
from .topic_api import Described, KeysRead

if TYPE_CHECKING:
    from ..wire.codec import EncodedBatch
    from .remote import RemoteTopic


class RemoteKeys:
    def __init__(self, topic: RemoteTopic) -> None:
        self._topic = topic

    async def put(
        self,
        partition: str,
        keys: list[str],
        tags: list[dict[str, Any]] | None,
        batch: EncodedBatch | None,
        blob: bytes | None,
        key: str | None,
    ) -> Described:
        topic = self._topic
        args = topic.args(partition=partition, keys=keys, tags=tags, key=key)
        if batch is not None and blob is not None:
            args.update(kinds=batch.kinds, count=len(batch.rows))
        reply = await topic.conn.request("kv_put", args, [blob] if blob is not None else [])
        first, count, indexes, runs = reply.result
        if batch is not None:
            topic.stored(int(first), int(count), dict(batch.kinds))
        return list(indexes), list(runs)

    async def get(self, partition: str, keys: list[str], fields: list[str] | None, mode: str, device: Any) -> KeysRead:
        topic = self._topic
        attempt = 0
        while True:
            attempt += 1
            args = topic.args(
                partition=partition,
                keys=keys,
                fields=fields,
                read=True,
                zerocopy=mode != "off",
                peer=peer_id(),
                released=releases.take(topic.address),
            )
            reply = await topic.conn.request("kv_get", args)
            named, runs, chosen, result = reply.result
            if result is None:
                return list(named), list(runs), list(chosen), None, 0, 0
            try:
                data, zero, copied = await topic.arena.data(result, reply.buffers, list(chosen), mode, device)
            except UnknownExtentError:
                if attempt == RESTART_RETRIES:
                    raise
                continue  # views into the arena of a broker that restarted since (ArenaClient._arena): again
            return list(named), list(runs), list(chosen), data, zero, copied

    async def listing(self, partition: str | None) -> dict[str, dict[str, dict[str, Any]]]:
        return dict(await self._topic.call("kv_list", partition=partition))

    async def clear(self, partition: str, keys: list[str]) -> int:
        return int(await self._topic.call("kv_clear", partition=partition, keys=keys))

    async def names(self, partition: str, indexes: list[int]) -> list[str | None]:
        return list(await self._topic.call("kv_names", partition=partition, indexes=indexes))
