"""Broker mode, the tensor plane on the client side: a mixin of ``remote.RemoteTopic``.

A put leases an extent of the broker's arena (or uses the one leased ahead in the previous put's reply), copies
the batch into it (the only copy a tensor gets) and sends the layout. A get receives offsets into the arena and
makes read-only views on this process's one mapping of it, checked against the mapping; the views' finalizers
tell the broker when they are gone (``Connection.defer_release``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from . import batches, errors
from .arena import Arena, attach_cached, peer_id
from .codec import EncodedBatch
from .tensors import Column

RESTART_RETRIES = 4  # attempts of a tensor put whose extents keep coming from a broker that then restarted

if TYPE_CHECKING:
    from .remote import Connection


class TensorClient:
    kinds: dict[str, str]
    _count: int
    _arena_info: dict[str, Any] | None
    _spare: list[Any] | None  # [extent, offset, bytes, generation] leased ahead for the next put

    if TYPE_CHECKING:  # provided by remote.RemoteTopic

        @property
        def _conn(self) -> Connection: ...

        def _args(self, **extra: Any) -> dict[str, Any]: ...

    async def _arena(self, generation: bytes | None = None) -> Arena | None:
        """This process's mapping of the broker's arena (made once; again after the broker restarted)."""
        info = self._arena_info
        if info is None or (generation is not None and info.get("generation") != generation):
            hello = await self._conn.request("hello", {})
            info = self._arena_info = dict(hello.result.get("arena") or {})
        if not info:
            return None
        return attach_cached(Path(info["path"]), bytes(info["generation"]))

    async def has_arena(self) -> bool:
        return await self._arena() is not None

    async def put_tensors(
        self,
        columns: dict[str, Column],
        other: EncodedBatch,
        other_blob: bytes,
        n: int,
        partition: str,
        timeout: float,
        of: list[int] | None = None,
    ) -> tuple[int, int]:
        places, total = batches.layout(columns)
        need = max(total, 1)
        fields = [[name, col.kind, col.dtype_name, list(col.sample_shape), off, nb] for name, col, off, nb in places]
        key = uuid.uuid4().hex  # one key for every attempt: the broker stores the batch once, whatever happens
        for attempt in range(RESTART_RETRIES):
            extent = await self._write(places, need, timeout)
            args = self._args(
                partition=partition,
                kinds=other.kinds,
                count=n,
                key=key,
                extent=extent,
                fields=fields,
                peer=peer_id(),
                lease_next=need,  # the reply brings the next put's extent: one round trip per put, not two
            )
            if of is not None:
                args["of"] = of
            try:
                result = (await self._conn.request("put_tensors", args, [other_blob])).result
                break
            except errors.UnknownExtentError:
                # The extent came from a broker that has restarted since (killed before it stored this batch,
                # or the lease was taken ahead): the new one never heard of it. Lease afresh, same key.
                if attempt == RESTART_RETRIES - 1:
                    raise
        first, count = result[0], result[1]
        if len(result) > 2 and result[2]:
            self._spare = list(result[2])
        self.kinds.update(other.kinds)
        self.kinds.update({name: col.kind for name, col in columns.items()})
        self._count = max(self._count, first + count)
        return int(first), int(count)

    async def _write(self, places: list[tuple[str, Column, int, int]], need: int, timeout: float) -> int:
        """Lease an extent of ``need`` bytes (or use the one leased ahead) and copy the tensors into it; returns
        its id."""
        arena = await self._arena()
        if arena is None:
            raise errors.ConfigError("the broker runs without an arena")
        spare, self._spare = self._spare, None
        if spare is not None and (spare[2] < need or bytes(spare[3]) != arena.generation):
            await self._give_back(spare)
            spare = None
        if spare is None:
            lease = {"nbytes": need, "timeout": timeout, "peer": peer_id(), "release": self._conn.take_releases()}
            extent, base, _size, generation = (await self._conn.request("lease", lease, hold=timeout)).result
        else:
            extent, base, _size, generation = spare
        if generation != arena.generation:
            arena = await self._arena(bytes(generation))
            if arena is None:
                raise errors.ConfigError("the broker runs without an arena")
        for _name, col, offset, nbytes in places:
            # The one copy a tensor gets: straight into the broker's shared memory.
            arena.view(base + offset, nbytes, writable=True)[:] = col.array.reshape(-1).view(np.uint8)
        return int(extent)

    async def _give_back(self, spare: list[Any]) -> None:
        """Return an extent leased ahead and not used (the next batch did not fit in it)."""
        with contextlib.suppress(errors.PersistingError):
            await self._conn.request("release", {"abandon": [spare[0]], "peer": peer_id()}, timeout=5)

    async def aclose(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            await self._give_back(spare)

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
        request_key = uuid.uuid4().hex

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
                release=self._conn.take_releases(),
            )

        reply = await self._conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
        indexes, descs = reply.result
        return list(indexes), list(descs)

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

    async def mark_consumed(self, partition: str, task: str, indexes: list[int]) -> None:
        await self._conn.request("mark_consumed", self._args(partition=partition, task=task, indexes=indexes))

    async def reset_consumption(self, partition: str, task: str) -> None:
        await self._conn.request("reset_consumption", self._args(partition=partition, task=task))

    async def get_data(
        self, indexes: list[int], fields: list[str], mode: str, device: Any
    ) -> tuple[batches.Batch, int, int]:
        """(data, bytes handed over as views, bytes copied)."""
        args = self._args(
            indexes=indexes, fields=fields, zerocopy=mode != "off", peer=peer_id(), release=self._conn.take_releases()
        )
        reply = await self._conn.request("get_data", args)
        return await self._data(reply.result, reply.buffers, fields, mode, device)

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
        request_key = uuid.uuid4().hex  # as in take

        def args(left: float) -> dict[str, Any]:
            return self._args(
                key=request_key,
                partition=partition,
                task=task,
                batch_size=batch_size,
                wait=left,
                fields=fields,
                zerocopy=mode != "off",
                sampler=sampler,
                sampler_kw=sampler_kw or {},
                lease_seconds=lease,
                peer=peer_id(),
                release=self._conn.take_releases(),
            )

        reply = await self._conn.long_poll("take", args, timeout, lambda r: bool(r.result[0]))
        indexes, descs, result = reply.result
        data, zero, copied = await self._data(result, reply.buffers, fields, mode, device)
        return list(indexes), list(descs), data, zero, copied

    async def _data(
        self, result: Any, buffers: list[bytes], fields: list[str], mode: str, device: Any
    ) -> tuple[batches.Batch, int, int]:
        if len(buffers) != 1 or not isinstance(result, dict):
            raise errors.ProtocolError("a data reply without its rows buffer")
        rows = msgpack.unpackb(buffers[0], raw=False, use_list=True)
        if "hold" not in result:
            data = batches.from_rows(rows, result["kinds"], fields, device)
            return data, 0, len(buffers[0])
        loop = asyncio.get_running_loop()
        conn, hold = self._conn, result["hold"]

        def release() -> None:  # from a finalizer, in any thread, maybe after the loop closed
            conn.defer_release(hold, loop)

        try:
            arena = await self._arena(bytes(result["generation"]))
            if arena is None:
                raise errors.ConfigError("the broker runs without an arena")
            tensor_fields = [f for f in fields if f not in result["kinds"]]
            data, zero, copied = batches.from_runs(arena, result["runs"], tensor_fields, mode, device, release)
        except BaseException:
            release()
            raise
        if result["kinds"]:
            data.update(batches.from_rows(rows, result["kinds"], list(result["kinds"]), device))
        ordered = batches.Batch((f, data[f]) for f in fields if f in data)
        ordered._hold, data._hold = data._hold, None
        return ordered, zero, copied
