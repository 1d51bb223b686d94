"""How a repair replaces a file: the new bytes under a temporary name, synced, renamed over it, folder synced,
so a kill leaves the old file or the new one (the engine writes its JSON files and compacts its logs the same
way)."""

from __future__ import annotations

import os
from pathlib import Path

from ..engine.wal import fsync_dir

TMP_SUFFIX = ".check-tmp"  # a repair's temporary file: a leftover of a killed repair is removed by the next one


def replace_bytes(path: Path, pieces: list[bytes]) -> int:
    """Replace ``path`` with the concatenation of ``pieces``; returns its new size."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    size = 0
    with open(tmp, "wb") as f:
        for piece in pieces:
            f.write(piece)
            size += len(piece)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return size
