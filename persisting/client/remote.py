"""Broker mode on the client side: a RemoteTopic with the engine's interface, over the process's connection.

``Queue`` drives a RemoteTopic exactly as it drives an embedded ``Topic`` (append, read, wait_beyond, flush,
stats, take, describe, ...), so the API adds nothing in broker mode. A RemoteTopic runs on its caller's event loop
(``connection.py``: one DEALER per loop and broker); tensor batches go through the arena (``remote_tensors.py``:
an ``ArenaClient`` the RemoteTopic owns).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .. import errors
from ..engine import TopicConfig
from ..tensors import batches, pieces
from ..tensors.arena import peer_id
from ..wire import codec, protocol
from ..wire.codec import EncodedBatch
from ..wire.protocol import WAIT_SLICE_SECONDS
from . import connection as transport
from . import releases
from .connection import Connection, connection
from .remote_tensors import RESTART_RETRIES, ArenaClient
from .request_keys import put_key, take_key

# The settings a broker opens a topic with (broker/records.py checks them)
WIRE_CONFIG_KEYS = ("num_buckets", "bucket_column", "batch_size", "auto_flush_interval_sec", "durability")


class RemoteTopic:
    """A topic served by a broker, with the methods of ``engine.Topic`` that ``Queue`` uses."""

    def __init__(self, name: str, address: str, config: TopicConfig, pin_memory: bool = False) -> None:
        self.name = name
        self.address = address
        self.config = config
        self.kinds: dict[str, str] = {}
        self.riders = False  # whether the broker writes records riding on a request (from its hello)
        self._count = 0
        self._tensors = ArenaClient(address, self._args, pin_memory)
        # Sent with every request (a restarted broker reopens the topic from it): encoded once, here.
        self._wire_config = protocol.encoded({key: getattr(config, key) for key in WIRE_CONFIG_KEYS})

    @property
    def _conn(self) -> Connection:
        return connection(self.address)

    def _args(self, **extra: Any) -> dict[str, Any]:
        return {"topic": self.name, "config": self._wire_config, **extra}

    async def open(self) -> None:
        hello = await self._conn.request("hello", {"peer": peer_id()})  # listed by the status command
        self._tensors.hello(hello.result.get("arena") or {})
        self._conn.max_message_bytes = int(hello.result.get("max_message_bytes", protocol.DEFAULT_MAX_MESSAGE_BYTES))
        # A broker of this protocol version without riders (broker/riders.py) ignores a note or a then_put: their
        # records are then written by separate requests (compat/_engine.py), never silently left out.
        self.riders = "riders" in hello.result.get("features", ())
        stats = (await self._conn.request("stats", self._args())).result
        self.kinds = dict(stats.get("fields", {}))
        self._count = int(stats.get("total_count", 0))

    async def append(
        self,
        batch: EncodedBatch,
        partition: str,
        rows_blob: bytes,
        key: str | None = None,
        of: list[int] | None = None,
        dedup_bytes: tuple[int, int] | None = None,
    ) -> tuple[int, int]:
        args = {
            "topic": self.name,
            "config": self._wire_config,
            "partition": partition,
            "kinds": batch.kinds,
            "count": len(batch.rows),
            "key": key or put_key(),
        }
        if of is not None:
            args["of"] = of
        if dedup_bytes is not None:
            args["dedup"] = list(dedup_bytes)  # bytes of deduped fields put, stored: status and metrics
        reply = await self._conn.request("put_batch", args, [rows_blob])
        first, n = reply.result
        self.kinds.update(batch.kinds)
        self._count = max(self._count, first + n)
        return int(first), int(n)

    async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        rows, kinds, _end = await self.read_window(offset, limit)
        return rows, kinds

    async def read_window(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        rows, _waited, end = await self._read(self._args(offset=offset, limit=limit))
        return rows, self.kinds, end

    async def read_waiting(
        self, offset: int, limit: int, timeout: float | None
    ) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """Like read_window, but at the end of the data wait up to ``timeout`` seconds (None: for ever) for rows
        at ``offset``: a long-poll in the broker, so a consumer that keeps up pays one round trip per page."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = WAIT_SLICE_SECONDS if deadline is None else min(max(0.0, deadline - loop.time()), WAIT_SLICE_SECONDS)
            args = self._args(offset=offset, limit=limit, wait=left)
            rows, waited, end = await self._read(args, timeout=left + transport.REQUEST_TIMEOUT_SECONDS, hold=left)
            if rows or end > offset or (deadline is not None and loop.time() >= deadline):
                return rows, self.kinds, end
            # A broker from before read took "wait" answered at once: wait the old way.
            if not waited and not await self.wait_beyond(
                offset, None if deadline is None else max(0.0, deadline - loop.time())
            ):
                return [], self.kinds, offset

    async def _read(
        self, args: dict[str, Any], timeout: float | None = None, hold: float = 0.0
    ) -> tuple[list[dict[str, Any]], bool, int]:
        reply = await self._conn.request("read", args, timeout=timeout, hold=hold)
        if len(reply.buffers) != 1:
            raise errors.ProtocolError("read reply without its rows buffer")
        rows = codec.unpack_reply_rows(reply.buffers[0])
        self.kinds = dict(reply.result["kinds"])
        self._count = int(reply.result["count"])
        end = reply.result.get("end")
        if type(end) is not int:
            raise errors.ProtocolError("read reply without the end of its window")
        return rows, bool(reply.result.get("waited")), end

    async def wait_beyond(self, index: int, timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            hold = WAIT_SLICE_SECONDS if left is None else min(left, WAIT_SLICE_SECONDS)
            reply = await self._conn.request(
                "wait",
                self._args(index=index, timeout=left),
                timeout=hold + transport.REQUEST_TIMEOUT_SECONDS,
                hold=hold,
            )
            if reply.result or (deadline is not None and loop.time() >= deadline):
                return bool(reply.result)

    async def flush(self) -> None:
        await self._conn.request("flush", self._args())

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = (await self._conn.request("stats", self._args())).result
        result["broker"] = self.address
        return result

    def count(self) -> int:
        return self._count

    async def fetch_count(self) -> int:
        self._count = int((await self._conn.request("count", self._args())).result)
        return self._count

    # -- tensor batches (the arena client) ------------------------------------------------------------

    async def has_arena(self) -> bool:
        return await self._tensors.has_arena()

    def stored(self, first: int, count: int, kinds: dict[str, str]) -> tuple[int, int]:
        """A tensor batch the arena client sealed (``ArenaClient.put_tensors``/``put_reserved``): the topic's
        kinds and count learn from it; returns ``(first, count)``."""
        self.kinds.update(kinds)
        self._count = max(self._count, first + count)
        return first, count

    async def call(self, op: str, buffers: list[bytes] | None = None, **args: Any) -> Any:
        """One request on this topic (``op`` with the topic's arguments); its result."""
        return (await self._conn.request(op, self._args(**args), buffers or [])).result

    @property
    def arena(self) -> ArenaClient:
        """Tensor puts and reservations go through it (then ``stored``)."""
        return self._tensors

    async def aclose(self) -> None:
        await self._tensors.aclose()
        await releases.flush(self.address)  # holds whose views died on a loop that may never run again

    # -- samples --------------------------------------------------------------------------------------

    async def take(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None = 0.0,
        sampler: dict[str, Any] | None = None,
        sampler_kw: dict[str, int] | None = None,
        lease: float | None = None,
        fields: list[str] | None = None,
    ) -> tuple[list[int], list[list[Any]]]:
        """The broker's ``Topic.take``, waiting up to ``timeout`` (None: for ever) for a full batch of samples
        whose ``fields`` are all produced."""
        # One key for every slice and re-send of this take: a broker that died after logging it answers the
        # re-sent take (same key) with the same batch once it is back.
        request_key = take_key()

        def args(left: float) -> dict[str, Any]:
            return self._args(
                key=request_key,
                partition=partition,
                task=task,
                batch_size=batch_size,
                wait=left,
                sampler=sampler,
                sampler_kw=sampler_kw or {},
                lease_seconds=lease,
                ready_fields=fields,
                peer=peer_id(),
                released=releases.take(self.address),
            )

        reply = await self._conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
        indexes, descs = reply.result
        return list(indexes), list(descs)

    async def take_rows(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        sampler: dict[str, Any] | None,
        lease: float | None,
        fields: list[str],
        note: dict[str, Any] | None = None,
    ) -> tuple[list[tuple[int, dict[str, Any]]], range | None]:
        """take and the stored rows of ``fields`` (a later write of a field wins) in one round trip, without
        field descriptions or batches: the persist-queue layer's ``get`` of one record. Every sample is taken
        (``ready_fields`` nil), as the embedded ``Topic.take`` followed by ``sample_rows`` does. ``note``,
        {partition, field, values}: the broker appends ``{field: global index, **values}`` per sample taken before
        it replies; the range of those records comes second (None without a note or a sample, or where the broker
        writes no riders: the caller then writes them)."""
        request_key = take_key()  # as in take
        extra = {} if note is None or not self.riders else {"note": note}

        def args(left: float) -> dict[str, Any]:
            return self._args(
                **extra,
                key=request_key,
                partition=partition,
                task=task,
                batch_size=batch_size,
                wait=left,
                fields=fields,
                ready_fields=None,
                describe=False,  # the descriptions go unused here: a broker skips them for a take of one
                zerocopy=False,
                sampler=sampler,
                sampler_kw={},
                lease_seconds=lease,
                peer=peer_id(),
                released=releases.take(self.address),
            )

        reply = await self._conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
        indexes = reply.result[0]
        if not indexes:
            return [], None
        if len(reply.buffers) != 1:
            raise errors.ProtocolError("take reply without its rows buffer")
        rows = codec.unpack_reply_rows(reply.buffers[0])
        noted = reply.result[3] if "note" in extra and len(reply.result) > 3 else None
        return list(zip(indexes, rows, strict=True)), _range(noted)

    async def clear(self, partition: str, indexes: list[int] | None) -> int:
        reply = await self._conn.request("clear", self._args(partition=partition, indexes=indexes))
        return int(reply.result)

    async def set_tags(self, partition: str, items: list[tuple[int, dict[str, Any]]]) -> None:
        await self._conn.request("set_tags", self._args(partition=partition, items=[list(i) for i in items]))

    async def partitions(self) -> dict[str, dict[str, Any]]:
        reply = await self._conn.request("partitions", self._args())
        return dict(reply.result)

    async def describe(self, indexes: list[int]) -> list[list[Any]]:
        """The broker's ``Topic.describe``: field descriptions of samples, run-length encoded."""
        reply = await self._conn.request("describe", self._args(indexes=indexes))
        return list(reply.result)

    async def mark_consumed(
        self, partition: str, task: str, indexes: list[int], then_put: tuple[str, EncodedBatch, bytes] | None = None
    ) -> range | None:
        """``then_put`` (partition, encoded records, their rows blob): their put in the same round trip, after the
        consumption is logged; its range comes back (None without one)."""
        args = self._args(partition=partition, task=task, indexes=indexes)
        if then_put is None:
            await self._conn.request("mark_consumed", args)
            return None
        put_partition, batch, blob = then_put
        args["then_put"] = {
            "partition": put_partition,
            "kinds": batch.kinds,
            "count": len(batch.rows),
            "key": put_key(),
        }
        put = _range((await self._conn.request("mark_consumed", args, [blob])).result)
        self.kinds.update(batch.kinds)
        return put

    async def give_back(self, partition: str, task: str, indexes: list[int]) -> None:
        await self._conn.request("give_back", self._args(partition=partition, task=task, indexes=indexes))

    async def reset_consumption(self, partition: str, task: str) -> None:
        await self._conn.request("reset_consumption", self._args(partition=partition, task=task))

    async def get_data(
        self, indexes: list[int], fields: list[str], mode: str, device: Any, copy: bool = True, views_only: bool = False
    ) -> tuple[batches.Batch, int, int]:
        """(data, bytes handed over as views, bytes copied); ``copy=False``: a piece (see ``batches.from_columns``).
        ``views_only``: a batch too large for one reply of copies; an empty batch if it is not in shared memory."""
        attempt = 0
        while True:
            args = self._args(
                indexes=indexes,
                fields=fields,
                zerocopy=mode != "off",
                columns=True,  # dense fields read from Lance come as raw frames (wire/columns.py)
                peer=peer_id(),
                released=releases.take(self.address),
                **({"views_only": True} if views_only else {}),
            )
            reply = await self._conn.request("get_data", args)
            if isinstance(reply.result, dict) and reply.result.get("later"):
                return batches.Batch(), 0, 0
            try:
                return await self._tensors.data(reply.result, reply.buffers, fields, mode, device, copy)
            except errors.UnknownExtentError:
                attempt += 1  # views into the arena of a broker that restarted since (ArenaClient._arena): again
                if attempt == RESTART_RETRIES:
                    raise

    async def take_batch(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        fields: list[str],
        mode: str,
        device: Any,
        sampler: dict[str, Any] | None = None,
        sampler_kw: dict[str, int] | None = None,
        lease: float | None = None,
    ) -> tuple[list[int], list[list[Any]], batches.Batch, int, int]:
        """take and get_data in one round trip: (indexes, descriptions, data, bytes as views, bytes copied)."""
        request_key = take_key()  # as in take

        def args(left: float) -> dict[str, Any]:
            return self._args(
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
                released=releases.take(self.address),
            )

        reply = await self._conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
        attempt = 0
        while True:
            indexes, descs, result = reply.result
            if isinstance(result, dict) and result.get("later"):  # larger than the arena: asked for in pieces
                meta = batches.meta_from(list(indexes), partition, descs, fields)
                most = pieces.spool_above(await self._tensors.arena_bytes())
                fetch = self._piece(fields, mode, device)
                found = await self.from_spool(meta, fields, fetch, device)
                found = found or await pieces.gather(meta, fields, most, fetch) or {}
                return list(indexes), list(descs), batches.Batch(found), 0, sum(pieces.sample_bytes(meta, fields))
            try:
                data, zero, copied = await self._tensors.data(result, reply.buffers, fields, mode, device)
                return list(indexes), list(descs), data, zero, copied
            except errors.UnknownExtentError:
                attempt += 1
                if attempt == RESTART_RETRIES:
                    raise
            # The broker that answered restarted before this process mapped its arena (ArenaClient._arena): the
            # same take again, with its key, gets the same samples from the new broker, with their data from there.
            reply = await self._conn.request("take", args(0.0))

    async def from_spool(
        self, meta: Any, fields: list[str], fetch: Callable[[Any], Awaitable[Any]], device: Any
    ) -> dict[str, Any] | None:
        """A spooled batch's dense fields read from its files (``pieces.from_spool``), else None."""

        async def where(indexes: list[int], dense: list[str]) -> Any:
            return await self.call("spool_where", indexes=indexes, fields=dense)

        most = pieces.spool_above(await self._tensors.arena_bytes())
        return await pieces.from_spool(meta, fields, most, where, fetch, device)

    def _piece(self, fields: list[str], mode: str, device: Any) -> Callable[[Any], Awaitable[batches.Batch]]:
        async def fetch(meta: Any) -> batches.Batch:
            return (await self.get_data(meta.global_indexes, fields, mode, device, copy=False))[0]

        return fetch


def _range(first_count: Any) -> range | None:
    """A reply's [first global index, count] as a range (None for nil)."""
    if first_count is None:
        return None
    first, n = first_count
    return range(int(first), int(first) + int(n))
