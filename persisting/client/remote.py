"""Broker mode on the client side: ``RemoteTopic``, a broker's topic as a ``TopicAPI`` (topic_api.py: the contract).

``Queue`` drives a RemoteTopic exactly as it drives an embedded one (``embedded.EmbeddedTopic``), so the API adds
nothing in broker mode. A RemoteTopic runs on its caller's event loop (``connection.py``: one DEALER per loop and
broker), one request per call; tensor batches go through the arena (``remote_tensors.py``: an ``ArenaClient`` the
RemoteTopic owns), reads of samples' data are in ``remote_reads.py``, keyed samples in ``remote_keys.py``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

from .. import errors
from ..engine import TopicConfig
from ..tensors import batches
from ..tensors.arena import peer_id
from ..wire import codec, protocol
from ..wire.codec import EncodedBatch
from ..wire.protocol import WAIT_SLICE_SECONDS, Reply
from . import _loop, data_args, releases, remote_reads
from . import connection as transport
from .connection import Connection, connection
from .remote_keys import RemoteKeys
from .remote_tensors import ArenaClient
from .request_keys import put_key, take_key
from .topic_api import KeysAPI

__all__ = ["WIRE_CONFIG_KEYS", "RemoteTopic", "put_key"]  # put_key: its old path (now request_keys.py)

# The settings a broker opens a topic with (broker/topics.py checks them)
WIRE_CONFIG_KEYS = ("num_buckets", "bucket_column", "batch_size", "auto_flush_interval_sec", "durability")


class RemoteTopic:
    """A topic served by a broker; the ``TopicAPI`` contract (topic_api.py) says what each method does here."""

    exclusive = False  # other processes may use the broker's topic at any time

    def __init__(self, name: str, address: str, config: TopicConfig, pin_memory: bool = False) -> None:
        self.name = name
        self.address = address
        self.config = config
        self.kinds: dict[str, str] = {}
        self.riders = False  # whether the broker writes records riding on a request (from its hello)
        self._count = 0
        self._tensors = ArenaClient(address, self.args, pin_memory)
        self.keys: KeysAPI = RemoteKeys(self)
        # Sent with every request (a restarted broker reopens the topic from it): encoded once, here.
        self._wire_config = protocol.encoded({key: getattr(config, key) for key in WIRE_CONFIG_KEYS})

    @property
    def conn(self) -> Connection:
        """This loop's connection to the broker."""
        return connection(self.address)

    def args(self, **extra: Any) -> dict[str, Any]:
        """A request's arguments on this topic: the topic, its settings (a restarted broker reopens it), ``extra``."""
        return {"topic": self.name, "config": self._wire_config, **extra}

    async def open(self) -> None:
        hello = await self.conn.request("hello", {"peer": peer_id()})  # listed by the status command
        self._tensors.hello(hello.result.get("arena") or {})
        self.conn.max_message_bytes = int(hello.result.get("max_message_bytes", protocol.DEFAULT_MAX_MESSAGE_BYTES))
        # A broker of this protocol version without riders (broker/requests/riders.py) ignores a note or a
        # then_put: their records are then written by separate requests (mark_consumed here; a take's note by the
        # persist-queue layer, told by take_rows), never silently left out.
        self.riders = "riders" in hello.result.get("features", ())
        stats = (await self.conn.request("stats", self.args())).result
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
        durable: bool = True,  # a broker's puts are always durable
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
        reply = await self.conn.request("put_batch", args, [rows_blob])
        first, n = reply.result
        self.kinds.update(batch.kinds)
        self._count = max(self._count, first + n)
        return int(first), int(n)

    async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        rows, kinds, _end = await self.read_window(offset, limit)
        return rows, kinds

    async def read_window(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        rows, _waited, end = await self._read(self.args(offset=offset, limit=limit))
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
            args = self.args(offset=offset, limit=limit, wait=left)
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
        reply = await self.conn.request("read", args, timeout=timeout, hold=hold)
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
            reply = await self.conn.request(
                "wait",
                self.args(index=index, timeout=left),
                timeout=hold + transport.REQUEST_TIMEOUT_SECONDS,
                hold=hold,
            )
            if reply.result or (deadline is not None and loop.time() >= deadline):
                return bool(reply.result)

    async def flush(self) -> None:
        await self.conn.request("flush", self.args())

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = (await self.conn.request("stats", self.args())).result
        result["broker"] = self.address
        return result

    def count(self) -> int:
        return self._count

    def current_count(self) -> int:
        if _loop.on_engine_loop():  # its thread must not block: the count last seen
            return self._count
        return _loop.run(self.fetch_count())

    def new_put_key(self) -> str | None:
        return put_key()

    async def refresh_kinds(self, fields: list[str] | None) -> None:
        if fields is None or any(f not in self.kinds for f in fields):
            self.kinds.update((await self.stats()).get("fields", {}))

    async def fetch_count(self) -> int:
        self._count = int((await self.conn.request("count", self.args())).result)
        return self._count

    # -- tensor batches (the arena client) ------------------------------------------------------------

    def stored(self, first: int, count: int, kinds: dict[str, str]) -> tuple[int, int]:
        """A tensor batch the arena client sealed (``ArenaClient.put_tensors``/``put_reserved``): the topic's
        kinds and count learn from it; returns ``(first, count)``."""
        self.kinds.update(kinds)
        self._count = max(self._count, first + count)
        return first, count

    async def call(self, op: str, buffers: list[bytes] | None = None, **args: Any) -> Any:
        """One request on this topic (``op`` with the topic's arguments); its result."""
        return (await self.request(op, buffers, **args)).result

    async def request(self, op: str, buffers: list[bytes] | None = None, **args: Any) -> Reply:
        """One request on this topic; its whole reply (result and buffers)."""
        return await self.conn.request(op, self.args(**args), buffers or [])

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
        sampler: Any = None,
        sampler_kw: dict[str, int] | None = None,
        lease: float | None = None,
        fields: list[str] | None = None,
    ) -> tuple[list[int], list[list[Any]]]:
        """The broker's ``Topic.take``, waiting up to ``timeout`` (None: for ever) for a full batch of samples
        whose ``fields`` are all produced."""
        wire = data_args.sampler_wire(sampler)  # the built-in samplers only: the broker rebuilds them
        # One key for every slice and re-send of this take: a broker that died after logging it answers the
        # re-sent take (same key) with the same batch once it is back.
        request_key = take_key()

        def args(left: float) -> dict[str, Any]:
            return self.args(
                key=request_key,
                partition=partition,
                task=task,
                batch_size=batch_size,
                wait=left,
                sampler=wire,
                sampler_kw=sampler_kw or {},
                lease_seconds=lease,
                ready_fields=fields,
                peer=peer_id(),
                released=releases.take(self.address),
            )

        reply = await self.conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
        indexes, descs = reply.result
        return list(indexes), list(descs)

    async def take_batch(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        fields: list[str],
        mode: str,
        device: Any,
        sampler: Any = None,
        sampler_kw: dict[str, int] | None = None,
        lease: float | None = None,
    ) -> tuple[list[int], list[list[Any]], batches.Batch, int, int]:
        wire, kw = data_args.sampler_wire(sampler), sampler_kw or {}
        return await remote_reads.take_batch(
            self, partition, task, batch_size, timeout, fields, mode, device, wire, kw, lease
        )

    def get_data(
        self, indexes: list[int], fields: list[str], mode: str, device: Any, copy: bool = True, views_only: bool = False
    ) -> Coroutine[Any, Any, tuple[batches.Batch, int, int]]:
        return remote_reads.get_data(self, indexes, fields, mode, device, copy, views_only)

    async def take_rows(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        sampler: Any,
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
        wire = data_args.sampler_wire(sampler)
        request_key = take_key()  # as in take
        extra = {} if note is None or not self.riders else {"note": note}

        def args(left: float) -> dict[str, Any]:
            return self.args(
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
                sampler=wire,
                sampler_kw={},
                lease_seconds=lease,
                peer=peer_id(),
                released=releases.take(self.address),
            )

        reply = await self.conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
        indexes = reply.result[0]
        if not indexes:
            return [], None
        if len(reply.buffers) != 1:
            raise errors.ProtocolError("take reply without its rows buffer")
        rows = codec.unpack_reply_rows(reply.buffers[0])
        noted = reply.result[3] if "note" in extra and len(reply.result) > 3 else None
        return list(zip(indexes, rows, strict=True)), _range(noted)

    async def clear(self, partition: str, indexes: list[int] | None) -> int:
        reply = await self.conn.request("clear", self.args(partition=partition, indexes=indexes))
        return int(reply.result)

    async def set_tags(self, partition: str, items: list[tuple[int, dict[str, Any]]]) -> None:
        await self.conn.request("set_tags", self.args(partition=partition, items=[list(i) for i in items]))

    async def partitions(self) -> dict[str, dict[str, Any]]:
        reply = await self.conn.request("partitions", self.args())
        return dict(reply.result)

    async def describe(self, indexes: list[int]) -> list[list[Any]]:
        """The broker's ``Topic.describe``: field descriptions of samples, run-length encoded."""
        reply = await self.conn.request("describe", self.args(indexes=indexes))
        return list(reply.result)

    async def mark_consumed(
        self, partition: str, task: str, indexes: list[int], then_put: tuple[str, EncodedBatch, bytes] | None = None
    ) -> range | None:
        """``then_put`` (partition, encoded records, their rows blob): their put in the same round trip, after the
        consumption is logged (a broker without riders: a second request); its range comes back (None without
        one)."""
        args = self.args(partition=partition, task=task, indexes=indexes)
        if then_put is None or not self.riders:
            await self.conn.request("mark_consumed", args)
            if then_put is None:
                return None
            first, n = await self.append(then_put[1], then_put[0], then_put[2])
            return range(first, first + n)
        put_partition, batch, blob = then_put
        args["then_put"] = {
            "partition": put_partition,
            "kinds": batch.kinds,
            "count": len(batch.rows),
            "key": put_key(),
        }
        put = _range((await self.conn.request("mark_consumed", args, [blob])).result)
        self.kinds.update(batch.kinds)
        return put

    async def give_back(self, partition: str, task: str, indexes: list[int]) -> None:
        await self.conn.request("give_back", self.args(partition=partition, task=task, indexes=indexes))

    async def reset_consumption(self, partition: str, task: str) -> None:
        await self.conn.request("reset_consumption", self.args(partition=partition, task=task))

    async def consumed(self, partition: str, task: str) -> set[int] | None:
        return None  # the broker's to keep

    # -- batches through a spool file (big_batches.py) -----------------------------------------------

    async def spool_begin(self) -> tuple[str, str]:
        name, path = await self.call("spool_begin", pid=os.getpid())
        return str(name), str(path)

    async def put_spooled(
        self,
        plain: EncodedBatch,
        partition: str,
        blob: bytes,
        key: str,
        name: str,
        fields: list[Any],
        of: list[int] | None,
    ) -> tuple[int, int]:
        args = {"partition": partition, "count": len(plain.rows), "kinds": plain.kinds, "key": key, "name": name}
        first, count = await self.call("put_spooled", [blob], fields=fields, of=of, **args)
        kinds = {**plain.kinds, **{str(f[0]): str(f[1]) for f in fields}}
        return self.stored(int(first), int(count), kinds)

    async def spool_where(self, indexes: list[int], dense: list[str]) -> Any:
        return await self.call("spool_where", indexes=indexes, fields=dense)


def _range(first_count: Any) -> range | None:
    """A reply's [first global index, count] as a range (None for nil)."""
    if first_count is None:
        return None
    first, n = first_count
    return range(int(first), int(first) + int(n))
