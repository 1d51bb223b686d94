"""The broker's shared-memory budget: segments beyond the first, made on demand and given back when idle.

Segment 0 (the arena, ``--arena-bytes``) is made at start and lives as long as the broker. A lease that finds no
room in the segments there are (``extents.py``: free space first, then flushed extents nobody holds) gets a new
segment here, if the budget (``--shm-budget``) has room: at least ``MIN_SEGMENT_BYTES`` (small batches share
it), else the batch's size (a big batch gets one of its own). Making one costs what fresh memory costs (tmpfs
allocates and zeroes every page at ``fallocate``: ~0.3 s per GiB here), so it runs in a thread, and segments are
reused rather than made again:

    segment in use ──last extent freed or flushed, no hold──▶ idle ──SEGMENT_GRACE_SECONDS──▶ given back
                                                               │                              (unlinked)
                                                               └─ the most recently used idle segments, up to
                                                                  the pool (half the budget), are kept

A lease that needs a segment the budget has no room for gives back idle segments first (``extents.py``).
The default budget: the smaller of 30% of the machine's memory (Ray's default for its object store) and half
of /dev/shm's free space at start, never less than the arena (``default_budget``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from pathlib import Path

from persisting.errors import StorageError
from persisting.tensors.arena import HEADER_BYTES, SEGMENT_SHIFT, Arena, align_up

log = logging.getLogger("persisting.broker")

MIN_SEGMENT_BYTES = 64 * 1024 * 1024
SEGMENT_ALIGN_BYTES = 2 * 1024 * 1024
# An idle segment waits this long before it goes back: a stream of big batches, one in flight while the last
# one flushes, keeps reusing its segments (warm: no page is faulted in again) instead of making new ones.
SEGMENT_GRACE_SECONDS = float(os.environ.get("PERSISTING_SEGMENT_GRACE_S", "30"))
# The pool: idle segments kept past the grace period, the most recently used first, up to this share of the budget.
POOL_SHARE = float(os.environ.get("PERSISTING_SHM_POOL_SHARE", "0.5"))
SHORT_SHM_WARN_SECONDS = 60.0
BUDGET_RAM_SHARE = 0.3
BUDGET_SHM_FREE_SHARE = 0.5


def default_budget(arena_bytes: int, shm_dir: Path = Path("/dev/shm")) -> int:
    """The budget when none is set: min(30% of RAM, half of ``shm_dir``'s free space), at least the arena."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        st = os.statvfs(shm_dir)
        shm_free = st.f_bavail * st.f_frsize
    except OSError:
        shm_free = ram
    return max(int(min(ram * BUDGET_RAM_SHARE, shm_free * BUDGET_SHM_FREE_SHARE)), arena_bytes)


class SegmentBook:
    """Which segments exist, their bytes against the budget, and when each was last used."""

    def __init__(self, arena: Arena, budget_bytes: int, pool_bytes: int | None = None) -> None:
        self.arena = arena
        self.budget_bytes = max(budget_bytes, arena.size_bytes)
        self.pool_bytes = int(self.budget_bytes * POOL_SHARE) if pool_bytes is None else pool_bytes
        self.used_bytes = arena.size_bytes  # segment 0, and segments being made
        self._ids = itertools.count(1)
        self._sizes: dict[int, int] = {}  # segment index (> 0) -> file bytes
        self._last_used: dict[int, float] = {}
        self.made = self.given_back = 0
        self._warned_at = -SHORT_SHM_WARN_SECONDS

    def largest_batch_bytes(self) -> int:
        """The most one extent can be: a segment as large as the budget beside segment 0, or segment 0."""
        return max(self.budget_bytes - self.arena.size_bytes, self.arena.size_bytes) - HEADER_BYTES

    def room(self) -> int:
        return self.budget_bytes - self.used_bytes

    async def grow(self, nbytes: int) -> tuple[int, int] | None:
        """A new segment whose data area holds ``nbytes``: (space offset, bytes) of that area, to add to the free
        space; None when the budget has no room for it, or /dev/shm has not (others filled it since the budget was
        set): memory pressure either way, so the lease waits for a flush, then its put spills to disk."""
        need = align_up(nbytes + HEADER_BYTES, SEGMENT_ALIGN_BYTES)
        room = self.room() // SEGMENT_ALIGN_BYTES * SEGMENT_ALIGN_BYTES
        if room < need:
            return None
        size = min(max(need, MIN_SEGMENT_BYTES), room)
        index = next(self._ids)
        self.used_bytes += size  # before the await: two leases never both take the same room
        try:
            seg = await asyncio.to_thread(self.arena.new_segment, index, size)
        except StorageError as exc:
            self.used_bytes -= size
            now = time.monotonic()
            if now - self._warned_at >= SHORT_SHM_WARN_SECONDS:  # one line a minute, however many leases find it
                self._warned_at = now
                log.warning("no new shared-memory segment: %s", exc)
            return None
        except BaseException:
            self.used_bytes -= size
            raise
        self._sizes[index] = seg.size_bytes
        self._last_used[index] = time.monotonic()
        self.made += 1
        log.info(
            "shared-memory segment %d: %d bytes (%d of the %d budget in use)",
            index,
            size,
            self.used_bytes,
            self.budget_bytes,
        )
        return self.arena.add(index, seg)

    def touch(self, offset: int) -> None:
        """An extent at ``offset`` was leased, held, let go of, flushed or freed: its segment was in use until now
        (an idle segment's grace period runs from its last use)."""
        index = offset >> SEGMENT_SHIFT
        if index in self._last_used:
            self._last_used[index] = time.monotonic()

    def data_range(self, index: int) -> tuple[int, int]:
        return (index << SEGMENT_SHIFT) + HEADER_BYTES, self._sizes[index] - HEADER_BYTES

    def indexes(self) -> list[int]:
        """Segments beyond the first, the least recently used first."""
        return sorted(self._sizes, key=lambda i: self._last_used[i])

    def to_give_back(self, idle: list[int], now: float) -> list[int]:
        """Of the ``idle`` segments (nothing in them anyone needs), those past the grace period and beyond the pool
        (which keeps the most recently used ones)."""
        kept = 0
        out = []
        for index in sorted(idle, key=lambda i: -self._last_used[i]):
            if now - self._last_used[index] < SEGMENT_GRACE_SECONDS:
                continue
            if kept + self._sizes[index] <= self.pool_bytes:
                kept += self._sizes[index]
                continue
            out.append(index)
        return out

    def give_back(self, index: int) -> None:
        """Unlink segment ``index`` (its extents are gone already)."""
        self.used_bytes -= self._sizes.pop(index)
        del self._last_used[index]
        if not self.arena.drop_segment(index):
            # Its memory stays until those views go: a payload the broker no longer serves should hold none.
            log.warning("shared-memory segment %d given back while the broker still holds views of it", index)
        self.given_back += 1
        log.info(
            "shared-memory segment %d given back (%d of the %d budget in use)",
            index,
            self.used_bytes,
            self.budget_bytes,
        )

    def close(self) -> None:
        for index in list(self._sizes):
            self.give_back(index)

    def stats(self) -> dict[str, int]:
        return {
            "budget_bytes": self.budget_bytes,
            "segments": 1 + len(self._sizes),
            "segments_bytes": self.used_bytes,
            "pool_bytes": self.pool_bytes,
            "segments_made": self.made,
            "segments_given_back": self.given_back,
        }
