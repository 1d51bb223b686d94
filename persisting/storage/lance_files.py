"""The files of Lance datasets on local disk: one capped session per process, manifests a crash left behind, and
fsync (Lance never syncs; the engine trims its write-ahead log on the strength of a flush)."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import lance

log = logging.getLogger(__name__)

METADATA_CACHE_BYTES = 64 * 1024 * 1024
INDEX_CACHE_BYTES = 16 * 1024 * 1024

_session: lance.Session | None = None


def shared_session() -> lance.Session:
    """One Lance session per process with capped caches: RSS stays bounded however many appends are made."""
    global _session
    if _session is None:
        _session = lance.Session(
            index_cache_size_bytes=INDEX_CACHE_BYTES, metadata_cache_size_bytes=METADATA_CACHE_BYTES
        )
    return _session


def repair_manifests(uri: Path) -> None:
    """Remove zero-byte manifests: Lance cannot open a dataset whose newest manifest is empty."""
    versions = uri / "_versions"
    if not versions.is_dir():
        return
    for entry in os.scandir(versions):
        if entry.is_file() and entry.stat().st_size == 0:
            log.warning("removing empty Lance manifest %s (interrupted commit)", entry.path)
            os.unlink(entry.path)


def has_manifest(uri: Path) -> bool:
    """Whether a dataset folder holds a committed version (a non-empty manifest)."""
    versions = uri / "_versions"
    if not versions.is_dir():
        return False
    return any(e.is_file() and e.name.endswith(".manifest") and e.stat().st_size > 0 for e in os.scandir(versions))


def recover_folder(local: Path) -> None:
    """A local dataset folder as a kill or a power loss left it, made openable: zero-byte manifests removed, and
    the folder removed where no commit ever landed (a kill during the bucket's first write: nothing was stored,
    and the rows are still in the engine's write-ahead log, which replays them)."""
    if not local.exists():
        return
    repair_manifests(local)
    if not has_manifest(local):
        log.warning("removing Lance dataset %s: its first commit did not land", local)
        shutil.rmtree(local)


def fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileSync:
    """fsync of what Lance wrote in one dataset folder: every file that appeared since the last call, then the folders
    that gained entries. Thread-safe: an append and a compaction on worker threads may call it at the same time.

    Lance writes a data file under a temporary name (``.tmp*``) and renames it when complete, and commits a manifest
    by renaming too: a file seen under its final name is complete, so fsync'ing it once is enough whoever does it.
    """

    FOLDERS = ("data", "_versions", "_transactions", "_deletions")

    def __init__(self, folder: Path | None) -> None:
        self._folder = folder  # None: an object store (a commit is durable once the store acknowledged it)
        self._synced: set[str] = set()
        self._lock = threading.Lock()

    def existing(self) -> set[str]:
        found: set[str] = set()
        if self._folder is None:
            return found
        for sub in self.FOLDERS:
            d = self._folder / sub
            if d.is_dir():
                found.update(e.path for e in os.scandir(d) if e.is_file() and not e.name.startswith(".tmp"))
        return found

    def sync(self) -> None:
        if self._folder is None:
            return
        with self._lock:
            current = self.existing()
            new = current - self._synced
            for path in new:
                try:
                    fsync_path(path, os.O_RDONLY)
                except FileNotFoundError:  # removed meanwhile by a cleanup of old versions: nothing to keep
                    current.discard(path)
            folders = {os.path.dirname(p) for p in new}
            if not self._synced:  # the first commit also created the dataset's folders
                folders.update((str(self._folder), str(self._folder.parent)))
            for folder in folders:
                fsync_path(folder, os.O_RDONLY | os.O_DIRECTORY)
            self._synced = current

    def forget_removed(self) -> None:
        """Drop the files a cleanup removed from the record (it would otherwise grow with every version)."""
        with self._lock:
            self._synced &= self.existing()
