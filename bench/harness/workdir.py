"""The run's work folder: a fresh temp folder under ``--dir`` (or the system's temp folder), removed afterwards."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def work_dir(parent: Path | None, prefix: str) -> Iterator[Path]:
    """A fresh temp folder under ``parent`` (default /tmp), removed afterwards. Keep ``prefix`` short: brokers put
    their ipc sockets under it and a unix socket path has a limit of 107 bytes."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or "/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
