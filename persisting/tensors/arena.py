"""The shared-memory arena: one file in /dev/shm, created once by the broker; producers map it once, consumers see
it through mappings of their own.

Layout of the file (all integers little-endian)::

    offset 0                      HEADER_BYTES                                                     size_bytes
    ┌────────────────────────────┬──────────────┬──────────────┬───────────┬──────────────┬─────────────────┐
    │ header                     │ extent       │ extent       │ free      │ extent       │ free ...        │
    │ magic "PSTARENA" (8)       │ (leased or   │              │           │              │                 │
    │ version u32, header u32    │  sealed)     │              │           │              │                 │
    │ size_bytes u64             │              │              │           │              │                 │
    │ generation (16, uuid4)     │              │              │           │              │                 │
    └────────────────────────────┴──────────────┴──────────────┴───────────┴──────────────┴─────────────────┘

Extents start on EXTENT_ALIGN_BYTES boundaries; inside an extent each field of a batch starts on a
FIELD_ALIGN_BYTES boundary (so any dtype's view is aligned). Which byte ranges are extents, and in which state,
is the broker's memory only (``broker/extents.py``): clients never trust the file for that, and they check every
offset and length the broker sends against the arena's size before they map or view it (``Arena._check``).
Extents start on 4 KiB pages; where pages are larger, a consumer's private mapping may cover a neighbour's bytes
too, which is harmless: it never reads them, and what it writes there is its own copy.

Life of an extent (broker side)::

    free ──lease(owner)──▶ leased ──seal (put_tensors)──▶ sealed ──flushed to Lance──▶ cached ──a lease needs
     ▲                       │                               │                          │        the space and
     │                       └──owner died / failed put──────┼──────────────────────────┴──▶ no holds: free
     └────────────────────────────────────────────────────────┘
    get_data adds a hold per consumer (sealed or cached); release, or the consumer's death, drops it. A cached
    extent is still served as views; once evicted its samples are read back from Lance. Leases and holds belong
    to the process the kernel names for the connection (``broker/peers.py``), bounded per process
    (``broker/extents.py``).

Who maps what (decision: copy-on-write views for consumers; docs/concepts/consumer-isolation.md)::

    arena file (tmpfs pages) ◀─────────── MAP_SHARED, read+write, one per process (``attach``, MAP_POPULATE):
      │                                   producers write puts and reservations here; the broker reads them
      │                                   (log replay, flush) through its own shared mapping
      └──◀ MAP_PRIVATE, read+write, one per get_data call (``private``), over the pages of its extents:
           reads share the tmpfs pages (no copy); a page the consumer writes becomes its own anonymous copy
           (copy-on-write), which no other call, process or flush sees; unmapped when the last array made from
           the call is garbage-collected, then the hold goes back (``client/releases.py``)

    one get_data call:   mapped ──(views alive)──▶ last view collected ──▶ munmap (its written pages freed)
                                                                          └─▶ hold released to the broker

Why this and not read-only views: numpy's read-only flag does not stop ``torch.from_numpy``, and a PROT_READ
mapping turns a consumer's in-place ``x += 1`` into SIGSEGV. A private mapping per call (not one per process
with madvise(MADV_DONTNEED) when a hold ends) also keeps two calls of one process apart: a write through one
call's views never shows in another's. Its cost is the mmap/munmap per call and page faults on first touch
(the shared mapping is pre-faulted): measured in ``python -m bench arena --consumer-reads``. The consumer's own
pages stay valid after ``Batch.release()``, after the broker's death and the file's unlink (they show what was
there, or the consumer's writes); pages it did not write show the file, so after ``release()`` they may show a
later batch that reused the space (hence: do not use views after ``release()``).

The file is created, sized with ``posix_fallocate`` (tmpfs allocates and zeroes every page now, so a put never
takes a first-touch fault and a too-small /dev/shm fails at start with a clear error instead of SIGBUS later),
and unlinked by the broker, in ``close()``; never in ``__del__``. The generation changes with every file, so a
log frame that points into an arena can tell whether the file it finds at start-up is the one it meant.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import mmap
import os
import struct
import uuid
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, ProtocolError, StorageError

if TYPE_CHECKING:
    import numpy as np
else:
    from .lazy_numpy import np  # imported at first use: a broker client of records never loads it

MAGIC = b"PSTARENA"
VERSION = 1
HEADER_BYTES = 4096
EXTENT_ALIGN_BYTES = 4096
FIELD_ALIGN_BYTES = 64
_HEADER = struct.Struct("<8sII Q 16s")
SHM_DIR = Path("/dev/shm")
DEFAULT_ARENA_BYTES = 256 * 1024 * 1024
PAGE_BYTES = mmap.PAGESIZE

# mmap(2) and munmap(2) themselves: Python's mmap object (before 3.13's trackfd=False) dups the file descriptor for
# each mapping, and a consumer may keep thousands of get_data results alive; a raw mapping costs no descriptor.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def align_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def default_path(storage_path: Path) -> Path:
    """The arena of a storage path: stable, so a restarted broker finds the file a killed one left."""
    digest = hashlib.sha256(str(storage_path.absolute()).encode()).hexdigest()[:16]
    return SHM_DIR / f"persisting-{digest}.arena"


class Arena:
    """One mapping of an arena file. ``create`` (the broker) or ``attach`` (clients, or a restarted broker)."""

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, size_bytes: int, generation: bytes, owner: bool):
        self.path = path
        self.size_bytes = size_bytes
        self.generation = generation
        self._fd = fd
        self._mm = mm
        self._owner = owner
        # One uint8 array over the whole file: every view the arena hands out is a slice of it, so the mapping is
        # made once and numpy keeps it alive while any view exists.
        self._bytes = np.frombuffer(mm, dtype=np.uint8)

    @classmethod
    def create(cls, path: Path, size_bytes: int, mode: int = 0o600) -> Arena:
        if size_bytes < HEADER_BYTES + EXTENT_ALIGN_BYTES:
            raise ConfigError(
                f"arena size must be at least {HEADER_BYTES + EXTENT_ALIGN_BYTES} bytes, got {size_bytes}"
            )
        size_bytes = align_up(size_bytes, EXTENT_ALIGN_BYTES)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        except OSError as exc:
            raise StorageError(f"cannot create the arena file {path}: {exc}") from exc
        try:
            os.fchmod(fd, mode)  # the umask must not narrow it: a group of clients may need it
            os.posix_fallocate(fd, 0, size_bytes)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            raise StorageError(
                f"cannot reserve {size_bytes} bytes for the arena in {path.parent} ({exc}); "
                "make the arena smaller (--arena-bytes) or /dev/shm larger"
            ) from exc
        generation = uuid.uuid4().bytes
        # No MAP_POPULATE here: the broker touches payload only when it flushes; clients populate their mapping.
        mm = mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED)
        mm[: _HEADER.size] = _HEADER.pack(MAGIC, VERSION, HEADER_BYTES, size_bytes, generation)
        return cls(path, fd, mm, size_bytes, generation, owner=True)

    @classmethod
    def attach(cls, path: Path, expect_generation: bytes | None = None, writable: bool = True) -> Arena:
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except OSError as exc:
            raise StorageError(f"cannot open the arena file {path}: {exc}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise StorageError(f"{path} is {size} bytes: too small to be an arena")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=prot)
        except BaseException:
            os.close(fd)
            raise
        magic, version, header, size_bytes, generation = _HEADER.unpack_from(mm, 0)
        problem = None
        if magic != MAGIC or version != VERSION or header != HEADER_BYTES:
            problem = "it is not a persisting arena of this version"
        elif size_bytes != size:
            problem = f"its header says {size_bytes} bytes, the file has {size}"
        elif expect_generation is not None and generation != expect_generation:
            problem = "its generation differs from the broker's (the broker restarted; reconnect)"
        if problem is not None:
            mm.close()
            os.close(fd)
            raise StorageError(f"arena file {path}: {problem}")
        return cls(path, fd, mm, size_bytes, generation, owner=False)

    @property
    def closed(self) -> bool:
        """Closed: a broker of a newer generation replaced it (``attach_cached``), or the broker stopped."""
        return self._fd < 0

    def view(self, offset: int, nbytes: int, *, writable: bool = False) -> np.ndarray:
        """A uint8 view of ``[offset, offset + nbytes)`` in the shared mapping, checked against the mapping (offsets
        come from a peer). Writable only for producers (puts, reservations); consumers get ``private`` arrays."""
        self._check(offset, nbytes)
        # Straight from the mapping, not a slice of _bytes: each view then owns its base, so a finalizer on it
        # tells when every array made from it is gone (consumers' holds are released that way).
        out = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes, offset=offset)
        if not writable:
            out.flags.writeable = False
        return out

    def private(self, offset: int, nbytes: int) -> np.ndarray:
        """A writable uint8 array over ``[offset, offset + nbytes)`` in a mapping of its own, copy-on-write
        (MAP_PRIVATE): it reads the shared pages without a copy, and a page the caller writes becomes the caller's
        own copy, which nobody else sees and which goes with the mapping. The mapping is unmapped when the array
        (and every array made from it) is garbage-collected."""
        self._check(offset, nbytes)
        lo = offset - offset % PAGE_BYTES
        length = max(align_up(offset + nbytes, PAGE_BYTES) - lo, PAGE_BYTES)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        addr = _libc.mmap(None, length, prot, mmap.MAP_PRIVATE, self._fd, lo)
        if addr is None or addr == _MAP_FAILED:
            code = ctypes.get_errno()
            raise StorageError(f"cannot map {length} bytes of the arena {self.path}: {os.strerror(code)}")
        buf = (ctypes.c_ubyte * length).from_address(addr)
        # Every array made from ``out`` has ``out`` as its base (numpy stops collapsing bases at the ctypes
        # buffer), so its finalizer runs once nothing can reach the mapping any more.
        out = np.frombuffer(memoryview(buf), dtype=np.uint8, count=nbytes, offset=offset - lo)
        unmap = weakref.finalize(out, _libc.munmap, addr, length)
        unmap.atexit = False  # exit unmaps everything; at exit an array may still be reachable
        return out

    def _check(self, offset: int, nbytes: int) -> None:
        if (
            type(offset) is not int
            or type(nbytes) is not int
            or offset < HEADER_BYTES
            or nbytes < 0
            or offset + nbytes > self.size_bytes
        ):
            raise ProtocolError(
                f"arena range [{offset!r}, +{nbytes!r}) lies outside the data area [{HEADER_BYTES}, {self.size_bytes})"
            )

    def offset_of(self, address: int) -> int:
        """The file offset of a memory address inside this process's mapping."""
        start = int(self._bytes.ctypes.data)
        if not start <= address < start + self.size_bytes:
            raise ValueError("address outside the arena mapping")
        return address - start

    def contains(self, address: int) -> bool:
        """Whether a memory address lies inside this process's mapping of the arena."""
        start = int(self._bytes.ctypes.data)
        return start <= address < start + self.size_bytes

    def close(self) -> None:
        """Unmap (once no view is alive) and, for the creator, unlink the file."""
        if self._owner:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self._owner = False
        del self._bytes
        # Views still alive keep the mapping (BufferError): it goes when they do; the file is unlinked already.
        with contextlib.suppress(BufferError):
            self._mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# -- the client side: one mapping per arena file per process, and who this process is ---------------------

_attached: dict[tuple[str, bytes], Arena] = {}
_peer: tuple[int, tuple[int, int]] | None = None


def attach_cached(path: Path, generation: bytes) -> Arena:
    """Map an arena once per process and keep it. A restarted broker has a new generation, hence a new entry; the
    entries of older generations of the same path are closed then: their shared memory (an unlinked file) goes
    as soon as nothing uses it. Consumers' views have mappings of their own (``private``), and an older arena's
    reservation arrays keep its mapping until they are gone (``close`` leaves a mapping with live views)."""
    key = (str(path), generation)
    arena = _attached.get(key)
    if arena is None:
        arena = _attached[key] = Arena.attach(path, expect_generation=generation)
        for old in [k for k in _attached if k[0] == key[0] and k != key]:
            _attached.pop(old).close()
    return arena


Peer = tuple[int, int]  # (pid, start time in clock ticks since boot)


def peer_alive(peer: Peer) -> bool:
    """Whether the process ``peer`` names still runs (a reused pid has another start time)."""
    pid, started = peer
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The command name (field 2) may hold spaces or parentheses: split after its closing parenthesis.
    fields = stat.rsplit(b")", 1)[-1].split()
    return len(fields) > 19 and int(fields[19]) == started


def peer_id() -> list[int]:
    """[pid, start time]: how the broker tells this process from a later one that reuses its pid."""
    global _peer
    pid = os.getpid()
    if _peer is None or _peer[0] != pid:
        with open(f"/proc/{pid}/stat", "rb") as f:
            started = int(f.read().rsplit(b")", 1)[-1].split()[19])
        _peer = (pid, (pid, started))
    return list(_peer[1])
