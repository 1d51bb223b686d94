"""Tensor payloads a restarted broker could not re-adopt, kept on disk so that the shared memory can go.

A broker killed with acknowledged tensor batches not yet in Lance leaves its segment files in /dev/shm; the next
start opens every topic, whose log replay copies those payloads and flushes them (``tensor_memory.py``). A topic
that cannot be opened then (damaged on disk, held by an embedded process, a bug of the engine) still has log
frames that point into those files: unlinking them would lose acknowledged puts, keeping them would leave the
killed broker's shared memory (gigabytes, under a name no one reads) until some later start manages the open.

Decision: copy out what those frames need, then give the shared memory back. The start copies the byte ranges
the unopened topics' unflushed frames reference (``persisting.engine.arena_ranges``) into files on disk, syncs
them, writes the manifest, and only then unlinks the segment files, naming each one (path and size) in one log
line. It then serves: an unopenable topic no longer stops the whole broker after a kill, as it never did after a
clean stop (a topic opens at the first request that names it, and that request gets the topic's error)::

    <storage_path>/broker.kept/<generation hex>/segment.<k>   sparse copy of segment k: only the kept ranges
    <storage_path>/broker.kept/<generation hex>/kept.json     {"topics": [who still needs it], "ranges": [...]}

(no topic's folder has a dot in its name: ``engine/layout.py``). The broker resolves an offset of that generation
from these files as from the arena itself, and only inside a kept range (never a hole's zeros). A topic that opens
later through the broker (the next start, after a repair; or the first request naming it) replays its frames from
them and flushes them at its open; once every topic a manifest names has, its folder goes. Each start opens the
topics the manifests name, so kept bytes leave as soon as their topic opens again. A folder without a manifest is
a copy a kill interrupted (the segments were still in /dev/shm then, so the next start re-adopted or kept them
again): it is removed.

When the copy fails (disk full, storage not writable) the start fails instead, and leaves the segment files in
/dev/shm, named in the log: the next start re-adopts them. Either way no file is left unnamed, and no
acknowledged payload is dropped. An embedded ``Queue`` does not read kept payloads: open such a topic through a
broker.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import mmap
import os
import shutil
from pathlib import Path

import numpy as np

from persisting.engine import arena_ranges, fsync_dir, topic_dirname, write_json_atomic
from persisting.errors import PersistingError
from persisting.tensors.arena import Arena, split

log = logging.getLogger("persisting.broker")

KEPT_DIRNAME = "broker.kept"
MANIFEST = "kept.json"


def named(paths: list[Path]) -> str:
    """``path (size)`` of each file, for a log line."""
    out = []
    for path in paths:
        try:
            size = _mib(path.stat().st_size)
        except OSError:
            size = "gone"
        out.append(f"{path} ({size})")
    return ", ".join(out) or "none"


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


class KeptArena:
    """The kept ranges of one generation: resolvable offsets, and the topics that still need them."""

    def __init__(self, directory: Path, topics: set[str], ranges: list[tuple[int, int]]) -> None:
        self.directory = directory
        self.generation = bytes.fromhex(directory.name)
        self.topics = topics
        self._starts = [s for s, _e in ranges]
        self._ends = [e for _s, e in ranges]
        self._maps: dict[int, mmap.mmap] = {}

    @classmethod
    def load(cls, directory: Path) -> KeptArena:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        ranges = [(int(s), int(e)) for s, e in manifest["ranges"]]
        return cls(directory, {str(t) for t in manifest["topics"]}, ranges)

    def view(self, offset: int, nbytes: int) -> np.ndarray | None:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset + nbytes > self._ends[i]:
            return None
        index, local = split(offset)
        mm = self._maps.get(index)
        if mm is None:
            with open(self.directory / f"segment.{index}", "rb") as f:
                mm = self._maps[index] = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        return np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=local)

    def save(self) -> None:
        body = {
            "topics": sorted(self.topics),
            "ranges": [[s, e] for s, e in zip(self._starts, self._ends, strict=True)],
        }
        write_json_atomic(self.directory / MANIFEST, body)


class KeptStore:
    """Every kept generation under one storage path (``<storage_path>/broker.kept``)."""

    def __init__(self, storage_path: Path) -> None:
        self.storage_path = storage_path
        self.root = storage_path / KEPT_DIRNAME
        self.kept: dict[bytes, KeptArena] = {}

    def load(self) -> None:
        """Read the manifests; remove the folders of copies a kill interrupted (no manifest)."""
        if not self.root.is_dir():
            return
        for directory in sorted(self.root.iterdir()):
            if not (directory / MANIFEST).exists():
                log.warning("removing %s: an interrupted copy of a killed broker's payloads (not needed)", directory)
                shutil.rmtree(directory, ignore_errors=True)
                continue
            try:
                kept = KeptArena.load(directory)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("the kept payloads in %s are unreadable (%s): left as they are", directory, exc)
                continue
            self.kept[kept.generation] = kept
            log.warning(
                "%s holds tensor payloads of a killed broker that topic(s) %s still need (re-adopted at their open)",
                directory,
                ", ".join(sorted(kept.topics)),
            )

    def topics(self) -> set[str]:
        """The topics some kept payload waits for."""
        return {t for kept in self.kept.values() for t in kept.topics}

    def resolve(self, generation: bytes, offset: int, nbytes: int) -> np.ndarray | None:
        kept = self.kept.get(generation)
        return None if kept is None else kept.view(offset, nbytes)

    def keep(self, previous: Arena, topics: list[str]) -> tuple[Path, int] | None:
        """Copy the ranges of ``previous`` that the logs of ``topics`` still need to disk (blocking; OSError or a
        PersistingError on failure, having removed its partial copy). Returns (folder, bytes kept), or None
        when those logs need nothing from it."""
        needing: set[str] = set()
        wanted: list[tuple[int, int]] = []
        for name in topics:
            ranges = arena_ranges(self.storage_path / topic_dirname(name), previous.generation)
            if ranges:
                needing.add(name)
                wanted += [(offset, offset + nbytes) for offset, nbytes in ranges if nbytes > 0]
        if not needing:
            return None
        merged = _merge(wanted)
        directory = self.root / previous.generation.hex()
        shutil.rmtree(directory, ignore_errors=True)  # an interrupted copy of the same arena
        try:
            directory.mkdir(parents=True)
            copied = _copy(previous, directory, merged)
            kept = KeptArena(directory, needing, copied)
            kept.save()
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self.kept[kept.generation] = kept
        return directory, sum(e - s for s, e in copied)

    def adopted(self, topic: str) -> None:
        """``topic`` opened (its replay flushed whatever it took from kept payloads): it needs none of them now."""
        for generation, kept in list(self.kept.items()):
            if topic not in kept.topics:
                continue
            kept.topics.discard(topic)
            if kept.topics:
                kept.save()
                continue
            del self.kept[generation]
            shutil.rmtree(kept.directory, ignore_errors=True)
            log.info("topic %r re-adopted the last payloads kept in %s: removed", topic, kept.directory)
        with contextlib.suppress(OSError):
            self.root.rmdir()  # only when empty


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _copy(previous: Arena, directory: Path, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Write each range into ``segment.<k>`` at its offset in segment k (holes elsewhere); sync every file.
    Returns the ranges copied: one outside the files left (a malformed frame: its replay fails the same way) is
    logged and left out, so that it resolves to nothing rather than to zeros."""
    fds: dict[int, int] = {}
    copied = []
    try:
        for start, end in ranges:
            index, local = split(start)
            try:
                view = previous.view(start, end - start).data
            except PersistingError as exc:
                log.error("a log frame points outside the arena left behind (%s): that range is not kept", exc)
                continue
            fd = fds.get(index)
            if fd is None:
                fd = fds[index] = os.open(directory / f"segment.{index}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            written = 0
            while written < len(view):
                written += os.pwrite(fd, view[written:], local + written)
            copied.append((start, end))
        for fd in fds.values():
            os.fsync(fd)
    finally:
        for fd in fds.values():
            os.close(fd)
    fsync_dir(directory)
    return copied
