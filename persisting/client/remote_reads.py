"""Broker mode, reading samples' data: ``get_data`` and ``take_batch`` of a ``remote.RemoteTopic``.

A reply carries the data as views of the broker's shared memory where it lies there, else as copies
(``ArenaClient.data`` turns either into a batch); a batch larger than one reply of copies comes from its spool
files or in pieces (``tensors/pieces.py``). A broker that restarted between its reply and this process mapping
its arena is asked again, ``RESTART_RETRIES`` times at most. ``RemoteTopic`` hands these calls here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .. import errors
from ..tensors import batches, pieces
from ..tensors.arena import peer_id
from . import releases
from .remote_tensors import RESTART_RETRIES
from .request_keys import take_key

if TYPE_CHECKING:
    from .remote import RemoteTopic


async def get_data(
    topic: RemoteTopic,
    indexes: list[int],
    fields: list[str],
    mode: str,
    device: Any,
    copy: bool = True,
    views_only: bool = False,
) -> tuple[batches.Batch, int, int]:
    """(data, bytes handed over as views, bytes copied); ``copy=False``: a piece (see ``batches.from_columns``).
    ``views_only``: a batch too large for one reply of copies; an empty batch if it is not in shared memory."""
    attempt = 0
    while True:
        args = topic.args(
            indexes=indexes,
            fields=fields,
            zerocopy=mode != "off",
            columns=True,  # dense fields read from Lance come as raw frames (wire/columns.py)
            peer=peer_id(),
            released=releases.take(topic.address),
            **({"views_only": True} if views_only else {}),
        )
        reply = await topic.conn.request("get_data", args)
        if isinstance(reply.result, dict) and reply.result.get("later"):
            return batches.Batch(), 0, 0
        try:
            return await topic.arena.data(reply.result, reply.buffers, fields, mode, device, copy)
        except errors.UnknownExtentError:
            attempt += 1  # views into the arena of a broker that restarted since (ArenaClient._arena): again
            if attempt == RESTART_RETRIES:
                raise


async def take_batch(
    topic: RemoteTopic,
    partition: str,
    task: str,
    batch_size: int,
    timeout: float | None,
    fields: list[str],
    mode: str,
    device: Any,
    sampler: dict[str, Any] | None,
    sampler_kw: dict[str, int],
    lease: float | None,
) -> tuple[list[int], list[list[Any]], batches.Batch, int, int]:
    """take and get_data in one round trip: (indexes, descriptions, data, bytes as views, bytes copied).
    ``sampler``: its wire form."""
    request_key = take_key()  # one key for every slice and re-send (see RemoteTopic.take)

    def args(left: float) -> dict[str, Any]:
        return topic.args(
            key=request_key,
            partition=partition,
            task=task,
            batch_size=batch_size,
            wait=left,
            fields=fields,
            zerocopy=mode != "off",
            columns=True,
            sampler=sampler,
            sampler_kw=sampler_kw or {},
            lease_seconds=lease,
            peer=peer_id(),
            released=releases.take(topic.address),
        )

    reply = await topic.conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
    attempt = 0
    while True:
        indexes, descs, result = reply.result
        if isinstance(result, dict) and result.get("later"):  # larger than the arena: asked for in pieces
            meta = batches.meta_from(list(indexes), partition, descs, fields)
            most = pieces.spool_above(await topic.arena.arena_bytes())
            fetch = _piece(topic, fields, mode, device)
            found = await pieces.from_spool(meta, fields, most, topic.spool_where, fetch, device)
            found = found or await pieces.gather(meta, fields, most, fetch) or {}
            return list(indexes), list(descs), batches.Batch(found), 0, sum(pieces.sample_bytes(meta, fields))
        try:
            data, zero, copied = await topic.arena.data(result, reply.buffers, fields, mode, device)
            return list(indexes), list(descs), data, zero, copied
        except errors.UnknownExtentError:
            attempt += 1
            if attempt == RESTART_RETRIES:
                raise
        # The broker that answered restarted before this process mapped its arena (ArenaClient._arena): the
        # same take again, with its key, gets the same samples from the new broker, with their data from there.
        reply = await topic.conn.request("take", args(0.0))


def _piece(topic: RemoteTopic, fields: list[str], mode: str, device: Any) -> Callable[[Any], Awaitable[batches.Batch]]:
    async def fetch(meta: Any) -> batches.Batch:
        return (await get_data(topic, meta.global_indexes, fields, mode, device, copy=False))[0]

    return fetch
