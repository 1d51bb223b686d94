"""The files of Lance datasets on local disk: one capped session per process, manifests a crash left behind, and
fsync (Lance never syncs; the engine trims its write-ahead log on the strength of a flush)."""

from __future__ import annotations

import logging
import os
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


def fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
