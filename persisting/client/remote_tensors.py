"""Broker mode, the tensor plane on the client side: ``ArenaClient``, composed into ``remote.RemoteTopic``.

A put leases an extent of the broker's arena (or uses one leased ahead in an earlier put's reply), copies the
batch into it (the only copy a tensor gets) and sends the layout. Puts may run at once (tasks, threads): each
leases, copies and sends in turn, and awaits its reply while the next one copies. A get receives offsets into
the arena and makes copy-on-write views of it (``Arena.private``: one mapping per get, so what the consumer
writes stays its own), checked against the arena's size; the views' finalizers put the hold in this process's
book of releases (``releases.py``), which the next request, a timer on the engine loop or ``aclose()`` sends to
the broker.

A reservation (``Queue.reserve``, ``reservation.py``) leases its extent the same way (``reserve_extent``: by
this process, so the broker's reaper frees it if the process dies), hands the producer writable arrays on it,
and ``put_reserved`` seals it with the same ``put_tensors`` request, without touching the bytes.

Every ``put_tensors`` and abandon names the arena generation its extent came from: extent ids start again at 1
in a restarted broker, so without it an extent id leased from the old broker could seal or free an extent this
process leased from the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import errors
from ..tensors import batches
from ..tensors.arena import Arena, attach_cached, peer_id
from ..tensors.column import AnyColumn
from ..tensors.jagged import JaggedColumn
from ..wire import codec, columns
from ..wire.codec import EncodedBatch
from . import releases
from .connection import Connection, connection

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it

# attempts of a tensor put, a lease or a read of views whose arena keeps coming from a broker that then restarted
RESTART_RETRIES = 4
ATTACH_TRIES = 5  # mappings of the arena tried while the broker keeps restarting under us
ATTACH_RETRY_S = 0.2


@dataclass(slots=True, eq=False)
class ReservedExtent:
    """An extent leased for a reservation, until its put seals it or it is given back (``spent``)."""

    extent: int
    base: int  # its offset in the arena file
    nbytes: int  # the bytes the reservation's layout uses (the extent may be larger)
    arena: Arena
    spent: bool = False  # sealed, or given back: nothing more to tell the broker about it


def _abandon_soon(lease: ReservedExtent, address: str, loop: asyncio.AbstractEventLoop | None) -> None:
    """Give a reserved extent back without waiting (a failed or cancelled put, or its arrays were garbage-collected
    unput); from any thread. A sealed extent is left alone by the broker, so a late abandon is harmless."""
    if lease.spent:
        return
    lease.spent = True
    releases.abandon(address, lease.arena.generation, lease.extent, loop)


class ArenaClient:
    """This process's side of one topic's tensor plane: its mapping of the broker's arena, the extents leased
    ahead for the next puts, puts into extents, and views out of them. Composed into ``remote.RemoteTopic``, which
    gives it the topic's request arguments (``args``)."""

    def __init__(self, address: str, args: Callable[..., dict[str, Any]], pin: bool = False) -> None:
        self._address = address
        self._args = args
        self.pin = pin  # Queue(pin_memory=True): page-locked shared mappings, read for device="cuda" (pinning.py)
        self._arena_info: dict[str, Any] | None = None  # what the broker's hello said of its arena
        self._mapped: Arena | None = None  # this process's mapping of that arena, once made
        # Extents leased ahead for the next puts, [extent, offset, bytes, generation] each: a put asks for one
        # ahead only while fewer are here or on their way than the most puts this process has had running at once
        # (so puts kept in flight each find one, and a process holds no more spares than that).
        self._spares: list[list[Any]] = []
        self._asked_ahead = 0  # put_tensors requests sent that ask for an extent ahead and are not answered yet
        self._sealing = 0  # puts between their lease and their reply
        self._most_sealing = 0
        # Held from a put's lease to the moment its request is sent: puts of this process reach the broker in the
        # order they leased (one waiting for arena space is not overtaken), while the next put's copy runs during
        # the last one's round trip. One per event loop (a lock waited on is bound to its loop).
        self._send_order: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @property
    def _conn(self) -> Connection:
        return connection(self._address)

    def hello(self, info: dict[str, Any]) -> None:
        """The arena the broker's hello described (empty: none)."""
        self._learn(info)

    async def _arena(self, generation: bytes | None = None) -> Arena | None:
        """This process's mapping of the broker's arena (made once; again after the broker restarted).

        ``generation``: the arena a reply (a lease, views) named; its offsets mean something in that file only.
        If that broker restarted before this process mapped its arena, the file at the arena's path is the next
        broker's, of the same size: ``UnknownExtentError`` then, never that file (the caller leases or asks
        again; test_arena_restarts)."""
        mapped = self._mapped
        if mapped is not None and not mapped.closed and (generation is None or generation == mapped.generation):
            return mapped  # the arena of the broker's last hello, mapped already: no lookup per put
        info = self._arena_info
        if info is None or (generation is not None and info.get("generation") != generation):
            hello = await self._conn.request("hello", {})
            info = self._learn(hello.result.get("arena"))
        for attempt in range(ATTACH_TRIES):
            if generation is not None and (not info or bytes(info["generation"]) != generation):
                raise errors.UnknownExtentError(
                    "the broker restarted after naming its arena in a reply, before this process mapped that arena; "
                    "its extents went with it"
                )
            if not info:
                return None
            try:
                self._mapped = attach_cached(Path(info["path"]), bytes(info["generation"]), self.pin)
                return self._mapped
            except errors.StorageError:
                # The broker restarted between its hello and our mapping (the file is gone or of a newer
                # generation): ask again. A broker that is down makes the hello raise BrokerUnavailableError.
                if attempt == ATTACH_TRIES - 1:
                    raise
                await asyncio.sleep(ATTACH_RETRY_S * (attempt + 1))
                hello = await self._conn.request("hello", {})
                info = self._learn(hello.result.get("arena"))
        return None

    def _learn(self, info: dict[str, Any] | None) -> dict[str, Any]:
        """What a new hello said of the broker's arena (empty: none); the mapping is made again when needed."""
        self._arena_info, self._mapped = dict(info or {}), None
        return self._arena_info

    async def has_arena(self) -> bool:
        return await self._arena() is not None

    async def arena_bytes(self, key: str = "size_bytes") -> int | None:
        """The size of the broker's arena (``largest_batch_bytes``: the most tensor bytes one batch may have to go
        through its shared memory, the budget in one piece), or None without one (from its hello)."""
        if self._arena_info is None:
            hello = await self._conn.request("hello", {})
            self._learn(hello.result.get("arena"))
        size = (self._arena_info or {}).get(key)
        return int(size) if size else None

    async def put_tensors(
        self,
        columns: Mapping[str, AnyColumn],
        other: EncodedBatch,
        other_blob: bytes,
        n: int,
        partition: str,
        timeout: float,
        of: list[int] | None = None,
        key: str | None = None,
        kv: dict[str, Any] | None = None,
        dedup_bytes: tuple[int, int] | None = None,
        lease_ahead: bool = True,
    ) -> tuple[int, int, dict[str, str], list[Any]]:
        """(first, count, kinds, what a keyed put's reply adds: ``kv`` {keys, tags}, see broker/requests/kv.py).
        ``lease_ahead=False``: the next put is of another size (a deduped put's payloads, then its samples), so
        no extent of this one's size is leased ahead for it (it would hold arena space, and a consumer's views of
        the next put would pin all of it)."""
        places, total = batches.layout(columns)
        need = max(total, 1)
        fields = [batches.wire_field(name, col, off) for name, col, off, _nb in places]

        async def extent_for(_attempt: int) -> tuple[int, bytes]:
            return await self._write(places, need, timeout)

        ahead = need if lease_ahead else 0
        return await self._seal(
            fields, need, extent_for, other, other_blob, n, partition, of, key, kv, dedup_bytes, ahead
        )

    async def put_reserved(
        self,
        lease: ReservedExtent,
        fields: list[list[Any]],
        other: EncodedBatch,
        other_blob: bytes,
        n: int,
        partition: str,
        timeout: float,
        of: list[int] | None = None,
        key: str | None = None,
    ) -> tuple[int, int, dict[str, str]]:
        """Seal a reserved extent the producer has filled (``fields``: the put_tensors layout). No tensor byte is
        copied, unless the broker restarted since the reservation: then its bytes (still in this process's
        mapping of the old arena file) are copied once into an extent of the new arena."""

        async def extent_for(attempt: int) -> tuple[int, bytes]:
            if attempt:
                await self._move(lease, timeout)
            return lease.extent, lease.arena.generation

        return (await self._seal(fields, lease.nbytes, extent_for, other, other_blob, n, partition, of, key))[:3]

    async def _seal(
        self,
        fields: list[list[Any]],
        need: int,
        extent_for: Callable[[int], Awaitable[tuple[int, bytes]]],
        other: EncodedBatch,
        other_blob: bytes,
        n: int,
        partition: str,
        of: list[int] | None,
        key: str | None = None,
        kv: dict[str, Any] | None = None,
        dedup_bytes: tuple[int, int] | None = None,
        lease_next: int | None = None,
    ) -> tuple[int, int, dict[str, str], list[Any]]:
        """Send ``put_tensors`` for the extent ``extent_for(attempt)`` gives (id, arena generation); again, with
        the next attempt's extent, while the broker answers that it never leased it (it restarted)."""
        if key is None:
            key = uuid.uuid4().hex  # one key for every attempt: the broker stores the batch once, whatever happens
        put: dict[str, Any] = {"partition": partition, "kinds": other.kinds, "count": n, "key": key, "fields": fields}
        if of is not None:
            put["of"] = of
        if kv is not None:
            put["kv"] = kv
        if dedup_bytes is not None:
            put["dedup"] = list(dedup_bytes)  # bytes of deduped fields put, stored: status and metrics
        result: list[Any] = []
        self._sealing += 1
        self._most_sealing = max(self._most_sealing, self._sealing)
        try:
            for attempt in range(RESTART_RETRIES):
                try:
                    result = await self._send_put(
                        extent_for, attempt, put, other_blob, need if lease_next is None else lease_next
                    )
                    break
                except errors.UnknownExtentError:
                    # The extent came from a broker that has restarted since (killed before it stored this batch,
                    # or the lease was taken ahead): the new one never heard of it. Lease afresh, same key.
                    if attempt == RESTART_RETRIES - 1:
                        raise
        finally:
            self._sealing -= 1
        first, count = result[0], result[1]
        if len(result) > 2 and result[2]:
            self._spares.append(list(result[2]))
        kinds = dict(other.kinds)
        kinds.update({str(f[0]): str(f[1]) for f in fields})
        return int(first), int(count), kinds, list(result[3:])

    async def _send_put(
        self,
        extent_for: Callable[[int], Awaitable[tuple[int, bytes]]],
        attempt: int,
        put: dict[str, Any],
        blob: bytes,
        ahead: int,
    ) -> list[Any]:
        """One ``put_tensors`` request: its extent (leased, written) and its send in this process's put order,
        then its reply, during which the next put leases and copies."""
        loop = asyncio.get_running_loop()
        if self._send_order is None or self._send_order[0] is not loop:
            self._send_order = (loop, asyncio.Lock())
        order = self._send_order[1]
        await order.acquire()
        ordered = True
        try:
            extent, generation = await extent_for(attempt)
            if ahead and len(self._spares) + self._asked_ahead >= self._most_sealing:
                ahead = 0  # enough extents are here or on their way for as many puts as ever ran at once
            # lease_next: the reply brings the next put's extent, one round trip per put, not two
            args = self._args(**put, extent=extent, generation=generation, peer=peer_id(), lease_next=ahead)
            # Released before the await: Connection.request sends before it first suspends, and the next put
            # (woken by the release) runs only once this one suspends, so it is sent after this one.
            ordered = False
            order.release()
            self._asked_ahead += bool(ahead)
            try:
                return list((await self._conn.request("put_tensors", args, [blob])).result)
            finally:
                self._asked_ahead -= bool(ahead)
        finally:
            if ordered:
                order.release()

    async def _lease(self, need: int, timeout: float) -> tuple[int, int, Arena]:
        """An extent of at least ``need`` bytes for this process (the one leased ahead if it fits): (id, offset
        in the arena file, the arena it lies in: the one of the broker that leased it, never a later one)."""
        attempt = 0
        while True:
            spare = None
            while self._spares and spare is None:
                spare = self._spares.pop(0)
                if spare[2] < need:  # leased for a smaller batch: the next ones are likely this size
                    await self._give_back(spare)
                    spare = None
            if spare is None:
                released = releases.take(self._address)
                lease = {"nbytes": need, "timeout": timeout, "peer": peer_id(), "released": released}
                spare = (await self._conn.request("lease", lease, hold=timeout)).result
            extent, base, _size, generation = spare
            try:
                arena = await self._arena(bytes(generation))
            except errors.UnknownExtentError:
                # Leased (maybe ahead) by a broker that has restarted since: the extent is gone, and its offset in
                # the new broker's arena may hold a batch that broker acknowledged. Lease afresh; the other spares
                # from that broker went with it.
                self._spares = [s for s in self._spares if bytes(s[3]) != bytes(generation)]
                attempt += 1
                if attempt == RESTART_RETRIES:
                    raise
                continue
            if arena is None:
                raise errors.ConfigError("the broker runs without an arena")
            # Segments the broker has given back since: their memory goes once this process unmaps them too.
            arena.prune()
            return int(extent), int(base), arena

    async def _write(
        self, places: list[tuple[str, AnyColumn, int, int]], need: int, timeout: float
    ) -> tuple[int, bytes]:
        """Lease an extent of ``need`` bytes (or use the one leased ahead) and copy the tensors into it; returns
        its id and arena generation."""
        extent, base, arena = await self._lease(need, timeout)
        for _name, col, offset, nbytes in places:
            # The one copy a tensor gets: straight into the broker's shared memory.
            if isinstance(col, JaggedColumn):
                values = col.values.nbytes
                arena.view(base + offset, values, writable=True)[:] = col.values.reshape(-1).view(np.uint8)
                at = batches.jagged_offsets_at(offset, values)
                arena.view(base + at, col.offsets.nbytes, writable=True)[:] = col.offsets.view(np.uint8)
            else:  # (a strided source, e.g. every n-th sample of a deduped field, is read in place, not copied first)
                dst = arena.view(base + offset, nbytes, writable=True).view(col.array.dtype)
                dst.reshape(col.array.shape)[...] = col.array
        return extent, arena.generation

    async def reserve_extent(self, need: int, timeout: float) -> ReservedExtent:
        """Lease an extent for a reservation of ``need`` bytes (``need`` > 0)."""
        extent, base, arena = await self._lease(need, timeout)
        return ReservedExtent(extent, base, need, arena)

    def watch_reserved(self, owner: np.ndarray, lease: ReservedExtent) -> None:
        """Give ``lease`` back once ``owner`` (the uint8 view every array of the reservation is made from) is
        garbage-collected, if it was neither put nor abandoned by then: nothing can write into it any more."""
        done = weakref.finalize(owner, _abandon_soon, lease, self._address, asyncio.get_running_loop())
        done.atexit = False  # at exit the broker reaps what this process leased

    async def abandon_reserved(self, lease: ReservedExtent) -> None:
        """Give a reserved extent back now (best effort: a broker that restarted since never knew it)."""
        if lease.spent:
            return
        lease.spent = True
        args = {"abandon": [lease.extent], "generation": lease.arena.generation, "peer": peer_id()}
        with contextlib.suppress(errors.PersistingError):
            await self._conn.request("release", args, timeout=5)

    def abandon_reserved_soon(self, lease: ReservedExtent) -> None:
        """``abandon_reserved`` without waiting for the reply (from an ``except`` that may be a cancellation)."""
        _abandon_soon(lease, self._address, asyncio.get_running_loop())

    async def _move(self, lease: ReservedExtent, timeout: float) -> None:
        """Copy a reservation into a fresh extent after its own was lost to a broker restart."""
        extent, base, arena = await self._lease(lease.nbytes, timeout)
        arena.view(base, lease.nbytes, writable=True)[:] = lease.arena.view(lease.base, lease.nbytes)
        lease.extent, lease.base, lease.arena = extent, base, arena

    async def _give_back(self, spare: list[Any]) -> None:
        """Return an extent leased ahead and not used (the next batch did not fit in it)."""
        args = {"abandon": [spare[0]], "generation": bytes(spare[3]), "peer": peer_id()}
        with contextlib.suppress(errors.PersistingError):
            await self._conn.request("release", args, timeout=5)

    async def aclose(self) -> None:
        spares, self._spares = self._spares, []
        for spare in spares:
            await self._give_back(spare)

    async def data(
        self, result: Any, buffers: list[bytes], fields: list[str], mode: str, device: Any, copy: bool = True
    ) -> tuple[batches.Batch, int, int]:
        """A data reply's batch: (data, bytes as views, bytes copied). ``UnknownExtentError`` when its views lie in
        the arena of a broker that restarted before this process mapped it: the caller asks again."""
        if not buffers or not isinstance(result, dict):
            raise errors.ProtocolError("a data reply without its rows buffer")
        rows = codec.unpack_reply_rows(buffers[0])
        if "hold" not in result:
            dense = columns.arrays(result.get("columns", []), buffers[1:], len(rows))
            data = batches.from_columns(dense, rows, result["kinds"], fields, device, copy)
            return data, 0, sum(len(memoryview(b)) for b in buffers)
        if len(buffers) != 1:
            raise errors.ProtocolError("a data reply of arena views with more than its rows buffer")
        address, hold, generation = self._address, result["hold"], bytes(result["generation"])
        loop = asyncio.get_running_loop()

        def release() -> None:  # from a finalizer, in any thread, maybe after the loop closed
            releases.release(address, generation, hold, loop)

        try:
            arena = await self._arena(generation)
            if arena is None:
                raise errors.ConfigError("the broker runs without an arena")
            arena.prune()  # a consumer.s open descriptor of a segment the broker gave back would keep its memory
            wanted = [f for f in fields if f not in result["kinds"]]  # the tensor fields
            data, zero, copied = batches.from_runs(arena, result["runs"], wanted, mode, device, release, self.pin)
        except BaseException:
            release()
            raise
        if result["kinds"]:
            data.update(batches.from_rows(rows, result["kinds"], list(result["kinds"]), device))
        ordered = batches.Batch((f, data[f]) for f in fields if f in data)
        ordered._hold, data._hold = data._hold, None
        return ordered, zero, copied
