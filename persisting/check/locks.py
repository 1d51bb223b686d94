"""The locks a check takes: the same flocks the broker (``broker.lock`` of the storage folder) and the engine (each
topic's ``LOCK``) take, without waiting and without creating the file, so a check never runs beside a process
that writes the store and never writes anything itself."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..errors import TopicLockedError


def hold(path: Path) -> int | None:
    """The descriptor of ``path`` flock'ed exclusively (closing it releases the lock); None where the file does not
    exist (no process ever took it). ``TopicLockedError`` naming the holder's pid where another process holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise TopicLockedError(f"process {holder} holds {path}") from None
    return fd
