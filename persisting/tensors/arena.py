"""The broker's shared memory: segments within a budget, seen as one space of offsets.

Offsets the broker sends (leases, views, log frames) are offsets in this space::

    space offset = (segment index << SEGMENT_SHIFT) + offset in that segment's file     (SEGMENT_SHIFT = 40)

    segment 0   /dev/shm/persisting-<hash of storage path>.arena      made at start (--arena-bytes), lives as long
                                                                       as the broker: small batches stream here
    segment k   /dev/shm/persisting-<hash of storage path>.arena.<k>  made on demand, when a lease finds no room
                                                                       in the others (a big batch gets one of its
                                                                       own); k is never reused by one broker
    every segment is one file (``segment.py`` draws its layout) with the broker's generation in its header; the
    segments' sizes together never pass the budget (--shm-budget, ``broker/segments.py``)

Life of a segment (the broker's side; ``broker/segments.py`` decides, ``broker/extents.py`` keeps the extents)::

    created (fallocate'd: all its pages now) ──▶ extents leased, sealed, flushed, reused ──▶ no extent left
        ▲                                                                                      │
        └──── a lease that finds no room (reuses pooled segments first) ◀── kept (the pool) ◀──┤ for the grace
                                                                                               ▼ period, then
                                                                               unlinked (``drop_segment``)

Life of an extent (broker side)::

    free ──lease(owner)──▶ leased ──seal (put_tensors)──▶ sealed ──flushed to Lance──▶ cached ──a lease needs
     ▲                       │                               │                          │        the space and
     │                       └──owner died / failed put──────┼──────────────────────────┴──▶ no holds: free
     └────────────────────────────────────────────────────────┘
    get_data adds a hold per consumer (sealed or cached); release, or the consumer's death, drops it. A cached
    extent is still served as views; once evicted its samples are read back from Lance. Leases and holds belong
    to the process the kernel names for the connection (``broker/peers.py``), bounded per process.

Clients open a segment the first time an offset names it (the file name follows from the index; its header must
carry the generation of segment 0), and close it once the broker has unlinked it (``prune``, at each lease): a
retired segment's memory goes back when the last process that maps it lets go. Offsets from a peer are checked
against the segment they name before anything is mapped or viewed.

The generation changes with every broker start, so a log frame that points into this space can tell whether the
files it finds at start-up are the ones it meant. Whoever creates a file unlinks it, in ``close()`` or
``drop_segment``; never in ``__del__``.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ProtocolError, StorageError
from .peer import Peer, peer_alive, peer_id
from .segment import EXTENT_ALIGN_BYTES, FIELD_ALIGN_BYTES, HEADER_BYTES, PAGE_BYTES, Segment, align_up

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_ARENA_BYTES",
    "EXTENT_ALIGN_BYTES",
    "FIELD_ALIGN_BYTES",
    "HEADER_BYTES",
    "PAGE_BYTES",
    "SEGMENT_SHIFT",
    "Arena",
    "Peer",
    "align_up",
    "attach_cached",
    "default_path",
    "leftover_segments",
    "peer_alive",
    "peer_id",
    "segment_path",
    "split",
]

SHM_DIR = Path("/dev/shm")
DEFAULT_ARENA_BYTES = 256 * 1024 * 1024
SEGMENT_SHIFT = 40  # 1 TiB of offsets per segment: no segment is larger
_LOCAL_MASK = (1 << SEGMENT_SHIFT) - 1


def default_path(storage_path: Path, shm_dir: Path = SHM_DIR) -> Path:
    """The arena of a storage path: stable, so a restarted broker finds the files a killed one left."""
    digest = hashlib.sha256(str(storage_path.absolute()).encode()).hexdigest()[:16]
    return shm_dir / f"persisting-{digest}.arena"


def segment_path(path: Path, index: int) -> Path:
    return path if index == 0 else path.with_name(f"{path.name}.{index}")


def leftover_segments(path: Path) -> list[Path]:
    """Segment files beyond the first that a broker of ``path`` left (killed, or an older run)."""
    return sorted(p for p in path.parent.glob(f"{path.name}.*") if p.name.rsplit(".", 1)[-1].isdigit())


def split(offset: int) -> tuple[int, int]:
    """(segment index, offset in its file) of a space offset."""
    if type(offset) is not int or offset < 0:
        raise ProtocolError(f"shared-memory offset must be an int >= 0, got {offset!r}")
    return offset >> SEGMENT_SHIFT, offset & _LOCAL_MASK


class Arena:
    """This process's view of a broker's shared memory: ``create`` (the broker) or ``attach`` (clients, or a
    restarted broker reading what a killed one left)."""

    def __init__(self, path: Path, first: Segment, owner: bool, writable: bool, mode: int = 0o600) -> None:
        self.path = path
        self.generation = first.generation
        self.segments: dict[int, Segment] = {0: first}
        self._owner = owner
        self._writable = writable
        self._mode = mode  # of the files the owner creates
        self.pinned = False  # a client's shared mappings page-locked for CUDA (``pin``, tensors/pinning.py)

    @classmethod
    def create(cls, path: Path, size_bytes: int, mode: int = 0o600) -> Arena:
        """Segment 0 of a new broker (a new generation); ``add_segment`` makes the others."""
        first = Segment.create(path, size_bytes, uuid.uuid4().bytes, mode)
        return cls(path, first, owner=True, writable=True, mode=mode)

    @classmethod
    def attach(cls, path: Path, expect_generation: bytes | None = None, writable: bool = True) -> Arena:
        return cls(path, Segment.attach(path, expect_generation, writable), owner=False, writable=writable)

    @property
    def size_bytes(self) -> int:
        """Segment 0's size: the part made at start."""
        return self.segments[0].size_bytes

    @property
    def closed(self) -> bool:
        """Closed: a broker of a newer generation replaced it (``attach_cached``), or the broker stopped."""
        return self.segments[0].closed

    # -- the broker's side: segments come and go ----------------------------------------------------

    def new_segment(self, index: int, size_bytes: int) -> Segment:
        """Create the file of segment ``index`` (fallocate'd: ``StorageError`` if /dev/shm is short). It changes
        nothing here, so it may run in a thread (tmpfs zeroes every page now: ~0.3 s per GiB); ``add`` it then."""
        if not self._owner or index <= 0 or index in self.segments:
            raise ValueError(f"segment {index} cannot be added here")
        return Segment.create(segment_path(self.path, index), size_bytes, self.generation, self._mode)

    def add(self, index: int, seg: Segment) -> tuple[int, int]:
        """Take a segment made by ``new_segment``; returns the space offset and length of its data area."""
        self.segments[index] = seg
        return (index << SEGMENT_SHIFT) + HEADER_BYTES, seg.size_bytes - HEADER_BYTES

    def drop_segment(self, index: int) -> bool:
        """Unlink segment ``index`` and unmap it here (processes that still map it keep its pages until they let go).
        False: views of it in this process keep its mapping until they go."""
        seg = self.segments.pop(index, None)
        return seg is None or seg.close()

    # -- everyone's side ----------------------------------------------------------------------------

    def segment(self, index: int) -> Segment:
        seg = self.segments.get(index)
        if seg is None:
            if self._owner:
                raise ProtocolError(f"shared-memory segment {index} does not exist")
            try:
                seg = Segment.attach(segment_path(self.path, index), self.generation, self._writable)
            except StorageError as exc:
                raise ProtocolError(f"shared-memory segment {index} of {self.path.name}: {exc}") from exc
            if self.pinned:
                seg.pin(now=False)  # at its first shared view: a consumer's private reads need no shared mapping
            self.segments[index] = seg
        return seg

    def pin(self) -> None:
        """Page-lock this process's shared mappings for CUDA (a client that asked: ``pinning.py``): segment 0 now
        (mapped if it was not), the others at their first shared view; each until it is closed. Idempotent."""
        if not self.pinned:
            for index, seg in self.segments.items():
                seg.pin(now=index == 0)  # a refusal raises here, and again at the next call
            self.pinned = True

    def view(self, offset: int, nbytes: int, *, writable: bool = False) -> np.ndarray:
        """A uint8 view of ``[offset, offset + nbytes)`` in the shared mapping of the segment ``offset`` names."""
        index, local = split(offset)
        return self.segment(index).view(local, nbytes, writable=writable)

    def private(self, offset: int, nbytes: int) -> np.ndarray:
        """A copy-on-write array over ``[offset, offset + nbytes)`` (``Segment.private``); one segment only."""
        index, local = split(offset)
        return self.segment(index).private(local, nbytes)

    def offset_of(self, address: int) -> int:
        """The space offset of a memory address inside this process's shared mappings."""
        for index, seg in self.segments.items():
            local = seg.offset_of(address)
            if local is not None:
                return (index << SEGMENT_SHIFT) + local
        raise ValueError("address outside the shared-memory mappings")

    def contains(self, address: int) -> bool:
        return any(seg.offset_of(address) is not None for seg in self.segments.values())

    def prune(self) -> int:
        """Close this process's mappings of segments the broker has unlinked; returns how many went."""
        gone = [i for i, seg in self.segments.items() if i and not self._owner and seg.unlinked]
        for index in gone:
            self.segments.pop(index).close()
        return len(gone)

    def close(self) -> None:
        """Unmap every segment (once no view is alive) and, for the creator, unlink every file."""
        for seg in self.segments.values():
            seg.close()
        self.segments = {0: self.segments[0]}  # closed: ``closed`` says so


# -- the client side: one mapping per broker generation per process ---------------------------------

_attached: dict[tuple[str, bytes], Arena] = {}


def attach_cached(path: Path, generation: bytes, pin: bool = False) -> Arena:
    """Map an arena once per process and keep it. A restarted broker has a new generation, hence a new entry; the
    entries of older generations of the same path are closed then: their shared memory (unlinked files) goes
    as soon as nothing uses it. Consumers' views have mappings of their own (``private``), and an older arena's
    reservation arrays keep its mapping until they are gone (``close`` leaves a mapping with live views).

    ``pin``: page-lock its shared mappings for CUDA (``Arena.pin``; a ``ConfigError`` if CUDA refuses). The
    mappings are the process's, so one Queue that pins pins them for every Queue of the process."""
    key = (str(path), generation)
    arena = _attached.get(key)
    if arena is None:
        arena = _attached[key] = Arena.attach(path, expect_generation=generation)
        for old in [k for k in _attached if k[0] == key[0] and k != key]:
            _attached.pop(old).close()
    if pin:
        arena.pin()
    return arena
