"""The broker's book of extents in its shared memory: who leased what, what is sealed, who holds views, what can
be reused.

States and transitions are drawn in ``persisting/tensors/arena.py``. Everything here runs on the broker's loop.
Offsets are space offsets (segment index << 40 | offset in the segment), so one sorted free list covers every
segment and never coalesces across two. A lease takes, in this order: free space (segment 0 first), the space of
flushed extents nobody holds (oldest first), a new segment (``segments.py``, within the budget, giving back idle
segments first when the budget is short), and otherwise waits for a flush to free space, then ``Full``.

Peers are processes on this node, named by ``(pid, start time)``: the pid the kernel gives for the connection
(``peers.py``, never what a client says) and its start time from ``/proc`` (a pid alone can be reused by a new
process after the old one died, the pair cannot). ``reap()`` (called periodically) frees the leases and drops
the holds of peers that no longer exist, so a producer killed mid-write or a consumer killed holding views
never pins arena space.

A process that lives and does not let go (a bug, or a client written to do harm) is bounded instead: what one
process pins (the extents it leased and has not sealed, and the extents its holds keep, each counted once) may
not pass ``max_pinned_bytes`` (half the budget by default), except that a process pinning nothing may always take
one lease or one hold of any size (one batch larger than the bound still goes through). Past the bound its
leases wait for its own space to go (then ``Full``, naming the bound) and its get_data is answered with copies;
everyone else's puts go on.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from persisting.errors import ConfigError, Full, MemoryFull, ProtocolError, UnknownExtentError
from persisting.tensors.arena import EXTENT_ALIGN_BYTES, HEADER_BYTES, SEGMENT_SHIFT, Peer, align_up, peer_alive

from .segments import SegmentBook


@dataclass(slots=True)
class Extent:
    id: int
    offset: int
    nbytes: int
    owner: Peer
    sealed: bool = False
    persisted: bool = False
    topic: str = ""
    last_index: int = -1
    holds: dict[int, Peer] = field(default_factory=dict)  # hold id -> holder


class Extents:
    """First-fit allocation over the segments' data areas, with coalescing frees. ``book``: the segments beyond
    the first (none without one: the first segment of ``size_bytes`` is all there is)."""

    def __init__(
        self,
        size_bytes: int,
        on_pressure: Callable[[], None] | None = None,
        on_evict: Callable[[str, int], None] | None = None,
        max_pinned_bytes: int | None = None,
        book: SegmentBook | None = None,
    ) -> None:
        self.size_bytes = size_bytes
        self._book = book
        # the most one extent may be: a segment of its own within the budget, or all of segment 0
        self.largest_bytes = size_bytes - HEADER_BYTES if book is None else book.largest_batch_bytes()
        self.max_pinned_bytes = max_pinned_bytes or self.largest_bytes
        self._on_pressure = on_pressure  # called when a lease has to wait: flushing sooner frees extents
        self._on_evict = on_evict  # (topic, extent id): that flushed batch is no longer in shared memory
        self._free: list[tuple[int, int]] = [(HEADER_BYTES, size_bytes - HEADER_BYTES)]  # sorted (offset, nbytes)
        self.extents: dict[int, Extent] = {}
        self._ids = itertools.count(1)
        self._hold_ids = itertools.count(1)
        self._holds: dict[int, tuple[Peer, list[int]]] = {}  # hold id -> (holder, extent ids)
        self._freed = asyncio.Event()
        self.free_bytes = size_bytes - HEADER_BYTES
        # Sealed extents not yet in Lance, and their bytes: every put asks, so they are kept as they change.
        self._unpersisted: dict[int, Extent] = {}
        self._unpersisted_bytes = 0
        # What each process pins: extent id -> [reasons (its holds on it, +1 while it leases it), bytes].
        self._pins: dict[Peer, dict[int, list[int]]] = {}
        self._pinned: dict[Peer, int] = {}

    # -- leasing ------------------------------------------------------------------------------------

    def _take(self, nbytes: int) -> int | None:
        for i, (off, size) in enumerate(self._free):
            if size >= nbytes:
                if size == nbytes:
                    del self._free[i]
                else:
                    self._free[i] = (off + nbytes, size - nbytes)
                self.free_bytes -= nbytes
                return off
        return None

    def _give(self, off: int, nbytes: int) -> None:
        i = bisect.bisect_left(self._free, (off, 0))
        # Coalesce with the neighbours so that large leases keep fitting after many small ones came and went.
        if i < len(self._free) and off + nbytes == self._free[i][0]:
            nbytes += self._free[i][1]
            del self._free[i]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == off:
            off, nbytes = self._free[i - 1][0], self._free[i - 1][1] + nbytes
            del self._free[i - 1]
            i -= 1
        self._free.insert(i, (off, nbytes))
        self._wake()

    async def lease(self, nbytes: int, owner: Peer, timeout: float) -> Extent:
        """An extent of at least ``nbytes`` for ``owner``; waits for space up to ``timeout``, then ``Full``."""
        if nbytes <= 0:
            raise ProtocolError(f"lease size must be > 0, got {nbytes}")
        size = align_up(nbytes, EXTENT_ALIGN_BYTES)
        if size > self.largest_bytes:
            raise ConfigError(
                f"a batch of {nbytes} bytes is larger than the arena's budget (at most {self.largest_bytes} bytes "
                "in one piece); split the batch or start the broker with a larger --shm-budget "
                "(zerocopy_mode='auto' sends such a batch through a spool file instead)"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            allowed = self._may_pin(owner, size)
            off = self._take(size) if allowed else None
            if off is None and allowed and self._evict_for(size):
                off = self._take(size)
            if off is None and allowed:
                off = await self._grow(size)
            if off is not None:
                return self._new(off, size, owner)
            left = deadline - loop.time()
            if left <= 0 and not allowed:
                raise Full(
                    f"this process pins {self._pinned.get(owner, 0)} bytes of the arena (extents it leased and did "
                    f"not put, extents its views hold), the most one process may is {self.max_pinned_bytes}: "
                    "release views (del them, or Batch.release()) or put what it reserved"
                )
            if left <= 0:
                raise MemoryFull(
                    f"the arena has no free {size} bytes within {timeout:g} s ({self.free_bytes} free in pieces, "
                    f"{self.total_bytes()} in all of a budget of {self.budget_bytes()}): consumers hold views or "
                    "Lance is behind"
                )
            self.reap()
            if self._on_pressure is not None:
                self._on_pressure()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), min(left, 0.5))

    def try_lease(self, nbytes: int, owner: Peer) -> Extent | None:
        """An extent now if one is free (never evicts, never waits), else None."""
        size = align_up(nbytes, EXTENT_ALIGN_BYTES)
        fits = size <= self.largest_bytes and self._may_pin(owner, size)
        off = self._take(size) if fits else None
        return None if off is None else self._new(off, size, owner)

    def _new(self, off: int, size: int, owner: Peer) -> Extent:
        ext = Extent(next(self._ids), off, size, owner)
        self.extents[ext.id] = ext
        self._pin(owner, ext.id, size)
        if self._book is not None:
            self._book.touch(off)
        return ext

    # -- segments -----------------------------------------------------------------------------------

    def total_bytes(self) -> int:
        return self.size_bytes if self._book is None else self._book.used_bytes

    def budget_bytes(self) -> int:
        return self.size_bytes if self._book is None else self._book.budget_bytes

    async def _grow(self, size: int) -> int | None:
        """A new segment for a lease of ``size`` bytes, giving back idle segments if the budget is short."""
        book = self._book
        if book is None:
            return None
        need = size + HEADER_BYTES
        if book.room() < need:
            idle = self._idle_segments()
            if book.room() + sum(book.data_range(i)[1] + HEADER_BYTES for i in idle) < need:
                return None  # giving back warm segments would not make room: wait for a flush instead
            for index in idle:
                self._give_back(index)
                if book.room() >= need:
                    break
        made = await book.grow(size)
        if made is None:
            return None
        self.free_bytes += made[1]
        self._give(*made)
        return self._take(size)

    def _idle_segments(self) -> list[int]:
        """Segments beyond the first that nobody needs now (every extent in them flushed and not held), least
        recently used first."""
        if self._book is None:
            return []
        busy = {e.offset >> SEGMENT_SHIFT for e in self.extents.values() if not e.persisted or e.holds}
        return [i for i in self._book.indexes() if i not in busy]

    def _give_back(self, index: int) -> None:
        """Evict what segment ``index`` holds and unlink it."""
        if self._book is None:
            return
        for ext in [e for e in self.extents.values() if e.offset >> SEGMENT_SHIFT == index]:
            self._evict(ext)
        base, nbytes = self._book.data_range(index)
        i = bisect.bisect_left(self._free, (base, 0))
        if i == len(self._free) or self._free[i] != (base, nbytes):
            raise RuntimeError(f"segment {index} is not wholly free: {self._free[i : i + 1]} against {base, nbytes}")
        del self._free[i]
        self.free_bytes -= nbytes
        self._book.give_back(index)

    def give_back_idle(self) -> int:
        """Give back the segments idle past their grace period, beyond the pool (``segments.py``); returns how many."""
        if self._book is None:
            return 0
        gone = self._book.to_give_back(self._idle_segments(), time.monotonic())
        for index in gone:
            self._give_back(index)
        return len(gone)

    # -- what each process pins ---------------------------------------------------------------------

    def _pin(self, peer: Peer, extent_id: int, nbytes: int) -> None:
        mine = self._pins.setdefault(peer, {})
        entry = mine.get(extent_id)
        if entry is None:
            mine[extent_id] = [1, nbytes]
            self._pinned[peer] = self._pinned.get(peer, 0) + nbytes
        else:
            entry[0] += 1

    def _unpin(self, peer: Peer, extent_id: int) -> None:
        mine = self._pins.get(peer)
        entry = None if mine is None else mine.get(extent_id)
        if mine is None or entry is None:
            return
        entry[0] -= 1
        if entry[0] > 0:
            return
        del mine[extent_id]
        self._pinned[peer] -= entry[1]
        if not mine:
            del self._pins[peer], self._pinned[peer]
        self._wake()  # a lease of this process waiting on its bound may go now

    def _may_pin(self, peer: Peer, nbytes: int) -> bool:
        if self.max_pinned_bytes >= self.largest_bytes:
            return True  # no bound (PERSISTING_MAX_PINNED_SHARE=1): only space limits a lease
        have = self._pinned.get(peer, 0)
        return have == 0 or have + nbytes <= self.max_pinned_bytes

    def may_hold(self, peer: Peer, extent_ids: list[int]) -> bool:
        """Whether a hold of ``peer`` on these extents stays within its bound (else: serve copies)."""
        mine = self._pins.get(peer, {})
        new = {e: self.extents[e].nbytes for e in extent_ids if e not in mine and e in self.extents}
        return self._may_pin(peer, sum(new.values()))

    def pinned_bytes(self, peer: Peer) -> int:
        return self._pinned.get(peer, 0)

    def leased(self, extent_id: int, owner: Peer) -> Extent:
        ext = self.extents.get(extent_id)
        if ext is None or ext.sealed or ext.owner != owner:
            raise UnknownExtentError(f"extent {extent_id} is not leased by this process")
        return ext

    def seal(self, ext: Extent, topic: str, last_index: int) -> None:
        if not ext.sealed:
            self._unpersisted[ext.id] = ext
            self._unpersisted_bytes += ext.nbytes
            self._unpin(ext.owner, ext.id)  # stored: the broker's now, not its producer's
        ext.sealed, ext.topic, ext.last_index = True, topic, last_index

    def abandon(self, ext: Extent) -> None:
        """A lease that will not be sealed (failed put, dead producer): its space is free again."""
        self._drop(ext)

    # -- persistence and holds ----------------------------------------------------------------------

    def persisted(self, topic: str, flushed_upto: int) -> None:
        """Every row of ``topic`` below ``flushed_upto`` is in Lance: its extents may be reused from now on.

        They are not freed yet: consumers that have not taken those samples still get views. A lease that
        finds no free space evicts them, oldest first (``_evict_for``)."""
        done = [e for e in self._unpersisted.values() if e.topic == topic and e.last_index < flushed_upto]
        for ext in done:
            ext.persisted = True
            del self._unpersisted[ext.id]
            self._unpersisted_bytes -= ext.nbytes
            self._touch(ext)
        if done:
            self._wake()  # a lease waiting for space may evict these now, not at its next poll

    def _wake(self) -> None:
        self._freed.set()
        self._freed = asyncio.Event()

    def _evict_for(self, size: int) -> bool:
        """Free persisted extents nobody holds, oldest first, until ``size`` bytes fit; False if they never do.
        Only in segments large enough for ``size``: evicting small batches of segment 0 for a batch that only a
        segment of its own holds would lose their residency for nothing."""
        big_enough = {0} if self.size_bytes - HEADER_BYTES >= size else set()
        if self._book is not None:
            big_enough.update(i for i in self._book.indexes() if self._book.data_range(i)[1] >= size)
        for ext in sorted(self.extents.values(), key=lambda e: e.id):
            if ext.persisted and not ext.holds and ext.offset >> SEGMENT_SHIFT in big_enough:
                self._evict(ext)
                if any(n >= size for _, n in self._free):
                    return True
        return False

    def _evict(self, ext: Extent) -> None:
        self._drop(ext)
        if self._on_evict is not None:
            self._on_evict(ext.topic, ext.id)

    def hold(self, extent_ids: list[int], holder: Peer) -> int:
        hold_id = next(self._hold_ids)
        for eid in extent_ids:
            ext = self.extents[eid]
            ext.holds[hold_id] = holder
            self._pin(holder, eid, ext.nbytes)
            if self._book is not None:
                self._book.touch(ext.offset)
        self._holds[hold_id] = (holder, list(extent_ids))
        return hold_id

    def release(self, hold_id: int, holder: Peer | None = None) -> bool:
        entry = self._holds.get(hold_id)
        if entry is None or (holder is not None and entry[0] != holder):
            return False
        del self._holds[hold_id]
        for eid in entry[1]:
            self._unpin(entry[0], eid)
            ext = self.extents.get(eid)
            if ext is None:
                continue
            ext.holds.pop(hold_id, None)
            self._touch(ext)
        return True

    def _drop(self, ext: Extent) -> None:
        if self.extents.pop(ext.id, None) is not None:
            if not ext.sealed:
                self._unpin(ext.owner, ext.id)
            self.free_bytes += ext.nbytes
            if self._unpersisted.pop(ext.id, None) is not None:
                self._unpersisted_bytes -= ext.nbytes
            self._touch(ext)
            self._give(ext.offset, ext.nbytes)

    def _touch(self, ext: Extent) -> None:
        """``ext`` was flushed, freed or let go of: its segment may be idle from now on, so its grace period
        starts now (not at the lease or hold that began its use: a consumer that held views longer than the
        grace would see the segment go at once)."""
        if self._book is not None:
            self._book.touch(ext.offset)

    def reap(self) -> int:
        """Free the leases and holds of peers that died; returns how many leases and holds went."""
        alive: dict[Peer, bool] = {}

        def is_alive(peer: Peer) -> bool:
            if peer not in alive:
                alive[peer] = peer_alive(peer)
            return alive[peer]

        gone = 0
        for hold_id, (holder, _) in list(self._holds.items()):
            if not is_alive(holder):
                self.release(hold_id)
                gone += 1
        for ext in list(self.extents.values()):
            if not ext.sealed and not is_alive(ext.owner):
                self._drop(ext)
                gone += 1
        return gone

    def unpersisted_bytes(self) -> int:
        return self._unpersisted_bytes

    def stats(self) -> dict[str, int]:
        # One pass: every hello carries these figures.
        leased = leased_bytes = sealed = cached_bytes = held = 0
        for e in self.extents.values():
            if not e.sealed:
                leased += 1
                leased_bytes += e.nbytes
            else:
                sealed += 1
                if e.holds:
                    held += 1
                elif e.persisted:
                    cached_bytes += e.nbytes
        return {
            "size_bytes": self.total_bytes(),
            "first_segment_bytes": self.size_bytes,
            "free_bytes": self.free_bytes,
            "leased_extents": leased,
            "leased_bytes": leased_bytes,
            "sealed_extents": sealed,
            "unpersisted_bytes": self._unpersisted_bytes,
            # flushed and not held: kept for consumers that have not read them yet, reused when space runs out
            "cached_bytes": cached_bytes,
            "held_extents": held,
            "holds": len(self._holds),
            "max_pinned_bytes_per_process": self.max_pinned_bytes,
            "most_pinned_by_one_process": max(self._pinned.values(), default=0),
            **(self._book.stats() if self._book is not None else {"budget_bytes": self.size_bytes, "segments": 1}),
        }
