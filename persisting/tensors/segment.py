"""One segment of the broker's shared memory: one file in /dev/shm, created by the broker, mapped by clients.

Layout of the file (all integers little-endian)::

    offset 0                      HEADER_BYTES                                                     size_bytes
    ┌────────────────────────────┬──────────────┬──────────────┬───────────┬──────────────┬─────────────────┐
    │ header                     │ extent       │ extent       │ free      │ extent       │ free ...        │
    │ magic "PSTARENA" (8)       │ (leased or   │              │           │              │                 │
    │ version u32, header u32    │  sealed)     │              │           │              │                 │
    │ size_bytes u64             │              │              │           │              │                 │
    │ generation (16, uuid4)     │              │              │           │              │                 │
    └────────────────────────────┴──────────────┴──────────────┴───────────┴──────────────┴─────────────────┘

Every segment of one broker carries that broker's generation (``arena.py`` draws how segments make one space).
Extents start on EXTENT_ALIGN_BYTES boundaries; inside an extent each field of a batch starts on a
FIELD_ALIGN_BYTES boundary (so any dtype's view is aligned). Which byte ranges are extents, and in which state,
is the broker's memory only (``broker/extents.py``): clients never trust the file for that, and they check every
offset and length the broker sends against the segment's size before they map or view it (``_check``).

Who maps what (decision: copy-on-write views for consumers; docs/concepts/consumer-isolation.md)::

    segment file (tmpfs pages) ◀───────── MAP_SHARED, read+write, one per process, made on the first ``view``
      │                                   (MAP_POPULATE for clients): producers write puts and reservations
      │                                   here; the broker reads them (log replay, flush) through its own
      └──◀ MAP_PRIVATE, read+write, one per get_data call and segment (``private``), over the pages of its
           extents: reads share the tmpfs pages (no copy); a page the consumer writes becomes its own anonymous
           copy (copy-on-write), which no other call, process or flush sees; unmapped when the last array made
           from the call is garbage-collected, then the hold goes back (``client/releases.py``)

A consumer that only reads views never makes the shared mapping: its private ones need the descriptor only.
With ``pin_memory`` on (``pinning.py``) a client's shared mapping is also page-locked for CUDA, whole, when it is
made, and unlocked in ``close`` before it is unmapped; private mappings never are.

Why private views and not read-only ones: numpy's read-only flag does not stop ``torch.from_numpy``, and a
PROT_READ mapping turns a consumer's in-place ``x += 1`` into SIGSEGV. A private mapping per call also keeps two
calls of one process apart. Its cost is the mmap/munmap per call and page faults on first touch: measured in
``python -m bench arena --consumer-reads``. The consumer's own pages stay valid after ``Batch.release()``, after
the broker's death and the file's unlink; pages it did not write show the file, so after ``release()`` they may
show a later batch that reused the space (hence: do not use views after ``release()``).

The file is created, sized with ``posix_fallocate`` (tmpfs allocates and zeroes every page now, so a put never
takes a first-touch fault and a too-small /dev/shm fails at creation with a clear error instead of SIGBUS
later), and unlinked by the broker, in ``close()``; never in ``__del__``.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, ProtocolError, StorageError
from . import pinning

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it

MAGIC = b"PSTARENA"
VERSION = 1
HEADER_BYTES = 4096
EXTENT_ALIGN_BYTES = 4096
FIELD_ALIGN_BYTES = 64
HEADER = struct.Struct("<8sII Q 16s")
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


class Segment:
    """One segment file and this process's mappings of it: ``create`` (the broker) or ``attach``."""

    def __init__(self, path: Path, fd: int, size_bytes: int, generation: bytes, owner: bool, writable: bool):
        self.path = path
        self.size_bytes = size_bytes
        self.generation = generation
        self._fd = fd
        self._owner = owner
        self._writable = writable
        self._mm: mmap.mmap | None = None
        self._start = 0  # address of the shared mapping, once made
        self._pinning = False  # page-lock the shared mapping for CUDA (``pin``: a client that asked for it)
        self._pin: pinning.Pin | None = None  # that registration, from the mapping's making until ``close``

    @classmethod
    def create(cls, path: Path, size_bytes: int, generation: bytes, mode: int = 0o600) -> Segment:
        if size_bytes < HEADER_BYTES + EXTENT_ALIGN_BYTES:
            raise ConfigError(
                f"a shared-memory segment must be at least {HEADER_BYTES + EXTENT_ALIGN_BYTES} bytes, got {size_bytes}"
            )
        size_bytes = align_up(size_bytes, EXTENT_ALIGN_BYTES)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        except OSError as exc:
            raise StorageError(f"cannot create the shared-memory file {path}: {exc}") from exc
        try:
            os.fchmod(fd, mode)  # the umask must not narrow it: a group of clients may need it
            os.posix_fallocate(fd, 0, size_bytes)
            os.pwrite(fd, HEADER.pack(MAGIC, VERSION, HEADER_BYTES, size_bytes, generation), 0)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            raise StorageError(
                f"cannot reserve {size_bytes} bytes of shared memory in {path.parent} ({exc}); make the arena or "
                "the budget smaller (--arena-bytes, --shm-budget) or /dev/shm larger"
            ) from exc
        return cls(path, fd, size_bytes, generation, owner=True, writable=True)

    @classmethod
    def attach(cls, path: Path, expect_generation: bytes | None = None, writable: bool = True) -> Segment:
        """Open a segment file and check its header; nothing is mapped until a view needs it."""
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except OSError as exc:
            raise StorageError(f"cannot open the shared-memory file {path}: {exc}") from exc
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER.size, 0)
        except BaseException:
            os.close(fd)
            raise
        problem = None
        if size < HEADER_BYTES or len(head) < HEADER.size:
            problem = f"it is {size} bytes: too small to be a segment"
        else:
            magic, version, header, size_bytes, generation = HEADER.unpack(head)
            if magic != MAGIC or version != VERSION or header != HEADER_BYTES:
                problem = "it is not a persisting segment of this version"
            elif size_bytes != size:
                problem = f"its header says {size_bytes} bytes, the file has {size}"
            elif expect_generation is not None and generation != expect_generation:
                problem = "its generation differs from the broker's (the broker restarted; reconnect)"
        if problem is not None:
            os.close(fd)
            raise StorageError(f"shared-memory file {path}: {problem}")
        return cls(path, fd, size_bytes, generation, owner=False, writable=writable)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def unlinked(self) -> bool:
        """The broker removed the file (it retired the segment, or stopped): this mapping only keeps its memory."""
        return self._fd < 0 or os.fstat(self._fd).st_nlink == 0

    def _shared(self) -> mmap.mmap:
        if self._mm is None:
            if self._fd < 0:
                raise StorageError(f"the shared-memory file {self.path} is closed")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self._writable else 0)
            # The broker maps without MAP_POPULATE (it touches payload only when it flushes); clients populate:
            # one bulk fault of the whole file instead of one per page while a producer writes.
            flags = mmap.MAP_SHARED | (0 if self._owner else mmap.MAP_POPULATE)
            self._mm = mmap.mmap(self._fd, self.size_bytes, flags=flags, prot=prot)
            self._start = int(np.frombuffer(self._mm, dtype=np.uint8, count=1).ctypes.data)
        if self._pinning and self._pin is None:
            # Whole and once: every later view of it (any extent) is pinned, and there is one range to unregister
            # (registered ranges may not overlap: per-extent ones would need a book). A refusal leaves it unpinned
            # and raises, here and at the next use.
            self._pin = pinning.register(self._start, self.size_bytes, f"the shared-memory file {self.path}")
        return self._mm

    def pin(self, now: bool = True) -> None:
        """Page-lock the shared mapping for CUDA (``pinning.py``; clients only): ``now`` maps and registers it at
        once (its cost and any refusal here), else at its first use. Until ``close``."""
        if self._owner:
            raise ValueError("the broker does not pin its segments; clients do")
        self._pinning = True
        if now or self._mm is not None:
            self._shared()

    @property
    def pinned(self) -> bool:
        """The shared mapping is page-locked for CUDA now."""
        return self._pin is not None

    def view(self, offset: int, nbytes: int, *, writable: bool = False) -> np.ndarray:
        """A uint8 view of ``[offset, offset + nbytes)`` in the shared mapping, checked against the segment (offsets
        come from a peer). Writable only for producers (puts, reservations); consumers get ``private`` arrays."""
        self._check(offset, nbytes)
        # Straight from the mapping: each view then owns its base, so a finalizer on it tells when every array
        # made from it is gone (consumers' holds are released that way).
        out = np.frombuffer(self._shared(), dtype=np.uint8, count=nbytes, offset=offset)
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
            raise StorageError(f"cannot map {length} bytes of {self.path}: {os.strerror(code)}")
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
                f"shared-memory range [{offset!r}, +{nbytes!r}) lies outside the data area "
                f"[{HEADER_BYTES}, {self.size_bytes}) of {self.path.name}"
            )

    def offset_of(self, address: int) -> int | None:
        """The file offset of a memory address inside this process's shared mapping (None: not in it)."""
        if self._mm is None:
            return None
        start = self._start
        return address - start if start <= address < start + self.size_bytes else None

    def close(self) -> bool:
        """Unmap (once no view is alive) and, for the creator, unlink the file. False: views keep the mapping (and
        its memory) alive until they go."""
        if self._owner:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self._owner = False
        if self._mm is not None:
            # Unlocked before the munmap, and for good: a mapping that views keep alive (below) is unmapped by the
            # garbage collector later, where nothing could unlock it first; they read it unpinned meanwhile.
            pin, self._pin, self._pinning = self._pin, None, False
            if pin is not None:
                pinning.unregister(pin)
            try:
                self._mm.close()
                self._mm = None
            except BufferError:
                # Views still alive keep the mapping (and ``view`` keeps working over it, e.g. for a reservation
                # moved after a broker restart): it goes when they do; the file is unlinked already.
                pass
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        return self._mm is None
