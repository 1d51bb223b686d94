"""The write-ahead log: how a put becomes durable before it reaches Lance.

A topic's log is a folder of segments, each named by the first global index it may hold::

    wal/00000000000000000000.log   frames for indexes 0 .. 4999
    wal/00000000000000005000.log   frames for indexes 5000 .. (open, being appended)

A segment is a sequence of frames, one per put_batch::

    offset  size  field
    0       4     magic b"PWAL"
    4       4     crc32 of bytes 8.. end of payload
    8       8     first global index (u64, little endian)
    16      4     record count (u32)
    20      4     payload length (u32)
    24      n     payload: msgpack(header: [partition, new field kinds]) then msgpack(list of rows)

Frames are written into room allocated ahead (zeros, PREALLOCATE_BYTES at a time), so the file's size changes
once per step instead of at every frame; replay cuts the zeros after a segment's last frame quietly, and a
rotated-out or closed segment is trimmed to its frames.

Group commit: ``append`` only calls write(2); ``commit`` waits until one fdatasync covers everything appended
before it, so a burst of concurrent puts shares one sync; a round's fdatasync runs on the log's own thread
(syncer.py), or in a blocking caller's thread (inline.py). In ``process`` durability mode ``commit`` returns at
once (a write(2) survives the process being killed, not the machine losing power).

The engine rotates to a new segment when a flush starts and the current one holds ROTATE_AT_BYTES, and drops a
segment once every index it holds is stored in the backend and it has been idle for the idempotency window, so
the log stays small and its folder changes rarely. Replay stops at the first torn or corrupt
frame: that frame was never acknowledged (acks follow the sync), so the segment is truncated there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from ..errors import CorruptionError, StorageError
from ..wire import codec
from . import inline
from .syncer import Syncer

log = logging.getLogger(__name__)

_MAGIC = b"PWAL"
_HEADER = struct.Struct("<4sIQII")
_SUFFIX = ".log"
MAX_FRAME_BYTES = 2**32 - 1
ROTATE_AT_BYTES = 16 * 1024 * 1024  # a flush starts a new segment once the current one is this large
# Segments are allocated ahead in steps of this many bytes (zeros written past the last frame): an fdatasync after
# a write that neither grows the file nor fills an unwritten extent has no metadata to commit, ~1/3 cheaper on ext4.
PREALLOCATE_BYTES = 1024 * 1024


@dataclass(slots=True)
class Frame:
    first_index: int
    count: int
    header: Any  # the engine's per-batch data (partition, new field kinds, idempotency key)
    rows_blob: bytes

    def rows(self) -> list[dict[str, Any]]:
        """Decoded on demand: replay reads only the header of frames that are already in Lance."""
        try:
            rows = msgpack.unpackb(self.rows_blob, raw=False, strict_map_key=False, use_list=True)
        except ValueError as exc:
            raise CorruptionError(f"write-ahead log frame of index {self.first_index} does not decode") from exc
        if not isinstance(rows, list) or len(rows) != self.count:
            raise CorruptionError(f"write-ahead log frame of index {self.first_index} does not hold {self.count} rows")
        return rows


@dataclass(slots=True)
class _Round:
    target: int  # the write sequence number this round makes durable
    retired: list[_Segment]  # rotated-out segments it closes once synced
    fds: list[int]
    directory: Path | None  # the folder too, when a segment was created since the last round


@dataclass(slots=True)
class _Segment:
    start: int
    path: Path
    fd: int
    size: int  # bytes of frames (where the next one goes)
    allocated: int  # bytes the file holds (zeros past ``size``)
    dirty: bool = False


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _segment_name(start: int) -> str:
    return f"{start:020d}{_SUFFIX}"


class WriteAheadLog:
    def __init__(self, directory: Path, *, sync: bool) -> None:
        self.directory = directory
        self.sync = sync
        directory.mkdir(parents=True, exist_ok=True)
        self._current: _Segment | None = None
        self._retired: list[_Segment] = []  # rotated out, closed once synced
        self._written_seq = 0
        self._synced_seq = 0
        self._dir_dirty = False
        self._sync_task: asyncio.Task[None] | None = None
        self._syncer = Syncer(f"wal-sync {directory.parent.name}")
        self._failed: BaseException | None = None

    # -- start-up -----------------------------------------------------------------------------------

    def segments(self) -> list[tuple[int, Path]]:
        return segment_files(self.directory)

    def replay(self) -> Iterator[Frame]:
        """Every intact frame, oldest first. Truncates a torn tail and drops segments after it. Zeros after the
        last frame of a segment are its preallocated room, not a torn frame: cut off quietly."""
        segments = self.segments()
        for n, (_start, path) in enumerate(segments):
            data = path.read_bytes()
            pos = 0
            while pos < len(data):
                frame, end = self._parse(data, pos)
                if frame is None and data.count(0, pos) == len(data) - pos:
                    with open(path, "r+b") as f:
                        f.truncate(pos)
                        os.fsync(f.fileno())
                    break
                if frame is None:
                    log.warning(
                        "write-ahead log %s: torn or corrupt frame at byte %d of %d; "
                        "truncating there (it was never acknowledged)",
                        path.name,
                        pos,
                        len(data),
                    )
                    with open(path, "r+b") as f:
                        f.truncate(pos)
                        os.fsync(f.fileno())
                    for _s, later in segments[n + 1 :]:
                        log.warning("write-ahead log: dropping %s, written after a torn frame", later.name)
                        later.unlink()
                    fsync_dir(self.directory)
                    return
                yield frame
                pos = end

    @staticmethod
    def _parse(data: bytes, pos: int) -> tuple[Frame | None, int]:
        if pos + _HEADER.size > len(data):
            return None, pos
        magic, crc, first, count, length = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        if magic != _MAGIC or end > len(data):
            return None, pos
        if zlib.crc32(memoryview(data)[pos + 8 : end]) != crc:
            return None, pos
        # The frame's whole body is fed at once: the default buffer limit (100 MiB) would refuse a large put_batch.
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(length, 1))
        unpacker.feed(memoryview(data)[pos + _HEADER.size : end])
        try:
            header = next(unpacker)
        except (StopIteration, ValueError) as exc:
            raise CorruptionError(
                f"write-ahead log frame at byte {pos} passed its checksum but does not decode"
            ) from exc
        rows_at = pos + _HEADER.size + unpacker.tell()
        return Frame(first, count, header, bytes(memoryview(data)[rows_at:end])), end

    # -- writing ------------------------------------------------------------------------------------

    def current_bytes(self) -> int:
        return self._current.size if self._current is not None else 0

    def rotate(self, start: int) -> None:
        """Start a new segment whose first index is ``start``; the old one is closed once synced."""
        path = self.directory / _segment_name(start)
        if self._current is not None and self._current.start == start:
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"cannot create write-ahead log segment {path}: {exc}") from exc
        if self._current is not None:
            self._trim(self._current)
            if self.sync:
                # Closed by the next sync round: one may be running with this descriptor right now.
                self._retired.append(self._current)
            else:
                os.close(self._current.fd)
        size = os.fstat(fd).st_size  # replay cut off any zeros of an existing segment
        self._current = _Segment(start, path, fd, size, size)
        self._dir_dirty = True

    def _preallocate(self, seg: _Segment, need: int) -> None:
        """Make room for ``need`` more bytes of frames (once per PREALLOCATE_BYTES: that sync commits a size)."""
        if seg.size + need <= seg.allocated:
            return
        # Written zeros, not fallocate(2): a frame written into an unwritten extent still changes the extent map,
        # which costs a journal commit per fdatasync when the disk is busy (382 vs 664 us in one loaded run).
        start = max(seg.allocated, seg.size)  # never over a frame
        if need > PREALLOCATE_BYTES:  # a large frame grows the file itself (no zeros written under it first)
            seg.allocated = start
            return
        try:
            view, at = memoryview(bytes(seg.size + PREALLOCATE_BYTES - start)), start
            while view:
                n = os.pwrite(seg.fd, view, at)
                view, at = view[n:], at + n
        except OSError:  # a full disk: the frame's own write says so; zeros written so far are harmless
            pass
        seg.allocated = at

    def _trim(self, seg: _Segment) -> None:
        """Cut a segment's unused room (it is written no more; replay would skip the zeros anyway)."""
        if seg.allocated > seg.size:
            try:
                os.ftruncate(seg.fd, seg.size)
            except OSError:
                return
            seg.allocated = seg.size
            seg.dirty = True

    def append(self, first_index: int, count: int, header: Any, rows_blob: bytes) -> None:
        """Write one frame (no sync). On failure the segment is cut back, so no partial frame stays."""
        if self._failed is not None:
            raise StorageError("the write-ahead log failed earlier; reopen the queue") from self._failed
        seg = self._current
        if seg is None:
            raise StorageError("the write-ahead log is closed")
        payload = codec.pack(header) + rows_blob
        if len(payload) > MAX_FRAME_BYTES:
            raise StorageError(f"one put_batch may encode to at most {MAX_FRAME_BYTES} bytes; split it")
        body = struct.pack("<QII", first_index, count, len(payload)) + payload
        frame = _MAGIC + struct.pack("<I", zlib.crc32(body)) + body
        self._preallocate(seg, len(frame))
        try:
            n = os.pwrite(seg.fd, frame, seg.size)
            if n < len(frame):  # a short write (rare): the rest, piece by piece
                view, at = memoryview(frame)[n:], seg.size + n
                while view:
                    n = os.pwrite(seg.fd, view, at)
                    view, at = view[n:], at + n
        except OSError as exc:
            try:
                os.ftruncate(seg.fd, seg.size)
                seg.allocated = seg.size
            except OSError:
                self._failed = exc
            raise StorageError(f"cannot write to the write-ahead log {seg.path}: {exc}") from exc
        seg.size += len(frame)
        seg.dirty = True
        self._written_seq += 1

    @property
    def written(self) -> int:
        """How many frames were appended so far (a ``commit(upto=...)`` target)."""
        return self._written_seq

    async def commit(self, upto: int | None = None) -> None:
        """Return once everything appended before this call (``upto``: the first ``upto`` frames appended) is on
        stable storage."""
        if not self.sync:
            return
        target = self._written_seq if upto is None else upto
        while self._synced_seq < target:
            if self._failed is not None:
                raise StorageError("the write-ahead log could not be synced") from self._failed
            if self._sync_task is None:
                if inline.blocking_allowed():
                    # A blocking caller's own thread (inline.py): sync here, without two thread hand-offs. Nothing
                    # else runs engine code meanwhile, so the round is the same as a worker thread's.
                    round_ = self._round_start()
                    self._round_sync(round_)
                    self._round_done(round_)
                    continue
                self._sync_task = asyncio.ensure_future(self._sync_round())
            await asyncio.shield(self._sync_task)

    async def _sync_round(self) -> None:
        try:
            round_ = self._round_start()
            await self._syncer.run(lambda: self._round_sync(round_))
            self._round_done(round_)
        finally:
            self._sync_task = None

    def _round_start(self) -> _Round:
        """What one sync round covers: every frame written so far and the segments holding them (marked clean)."""
        retired = [*self._retired]
        segs = [seg for seg in retired if seg.dirty]
        if self._current is not None and self._current.dirty:
            segs.append(self._current)
        for seg in segs:
            seg.dirty = False
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        return _Round(self._written_seq, retired, [seg.fd for seg in segs], self.directory if dir_dirty else None)

    def _round_sync(self, round_: _Round) -> None:
        """The blocking part of a round (a worker thread, or an inline caller's thread)."""
        try:
            _sync_all(round_.fds, round_.directory)
        except OSError as exc:
            # After a failed fsync the page cache state is unknown; refuse further writes.
            self._failed = exc
            raise StorageError(f"fdatasync of the write-ahead log failed: {exc}") from exc

    def _round_done(self, round_: _Round) -> None:
        self._synced_seq = max(self._synced_seq, round_.target)
        for seg in round_.retired:  # nothing writes to a retired segment, and this round synced it
            self._retired.remove(seg)
            os.close(seg.fd)

    def droppable(self, flushed_upto: int, keep_seconds: float = 0.0) -> list[Path]:
        """Segments whose every index is below ``flushed_upto`` (already stored in the backend) and that were
        last written more than ``keep_seconds`` ago (their frames' idempotency keys still count until then)."""
        found = []
        now = time.time()
        for (_start, path), (next_start, _) in itertools.pairwise(self.segments()):
            if next_start > flushed_upto or (keep_seconds and now - path.stat().st_mtime < keep_seconds):
                break
            found.append(path)
        return found

    def drop(self, paths: list[Path]) -> None:
        """Delete segments chosen by ``droppable``. Safe in a worker thread: it only unlinks files. A segment
        still awaiting its fdatasync may go too; its rows are synced in Lance and its descriptor stays valid."""
        for path in paths:
            path.unlink()
        if paths and self.sync:
            fsync_dir(self.directory)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for _, p in self.segments())

    async def close(self) -> None:
        if self._sync_task is not None:
            await asyncio.shield(self._sync_task)
        self._syncer.stop()
        if self._current is not None and self._failed is None:
            self._trim(self._current)
        for seg in [*self._retired, *([self._current] if self._current else [])]:
            if seg.dirty and self.sync and self._failed is None:
                os.fdatasync(seg.fd)
            os.close(seg.fd)
        self._retired.clear()
        self._current = None


def segment_files(directory: Path) -> list[tuple[int, Path]]:
    """The segments of a log folder, (first index, path), oldest first."""
    return sorted((int(p.stem), p) for p in directory.iterdir() if p.suffix == _SUFFIX and p.stem.isdigit())


def parse_frame(data: bytes, pos: int) -> tuple[Frame | None, int]:
    """The intact frame at ``pos`` of a segment's bytes and where it ends; ``(None, pos)`` where the frame is torn
    or fails its checksum (``CorruptionError``: it passes and does not decode). Reads only (``persisting.check``)."""
    return WriteAheadLog._parse(data, pos)


def frame_bounds(data: bytes, pos: int) -> tuple[int, int, int] | None:
    """(first index, count, end) that the frame header at ``pos`` claims, its checksum not verified; None where no
    header starts there."""
    if pos + _HEADER.size > len(data):
        return None
    magic, _crc, first, count, length = _HEADER.unpack_from(data, pos)
    return (first, count, pos + _HEADER.size + length) if magic == _MAGIC else None


def _sync_all(fds: list[int], directory: Path | None) -> None:
    for fd in fds:
        os.fdatasync(fd)
    if directory is not None:
        fsync_dir(directory)
