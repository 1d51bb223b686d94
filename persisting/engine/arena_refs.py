"""What a topic's write-ahead log still needs from one broker arena: the byte ranges its unflushed frames point to.

Read only, and without opening the topic (its lock, its buckets): a broker whose start cannot open a topic keeps
these ranges on disk before it gives the arena of the killed broker back (``broker/kept.py``); the topic's next
open replays those frames from them (``opening.readopt``). An arena frame's reference (made by the broker's
``put_tensors``: ``broker/requests/tensors.py``) is ``{"gen": arena generation, "offset": extent's space offset,
"fields": [[name, kind, dtype, sample shape, offset, nbytes, ...], ...]}``; a jagged field also names its offsets
array (``[..., at, total]``: ``count + 1`` int64 at ``at``), which the replay reads as well.

A frame that passes its checksum but does not decode is skipped by its length (the replay refuses it; what follows
may still be needed once the log is repaired); a torn or corrupt frame ends the segment, as the replay cuts it
there (``wal.py``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..errors import CorruptionError
from ..tensors import jagged
from .wal import _HEADER, WriteAheadLog

log = logging.getLogger(__name__)


def arena_ranges(topic_path: Path, generation: bytes) -> list[tuple[int, int]]:
    """(space offset, nbytes) of every range of the arena ``generation`` that a frame above the topic's
    ``flushed_upto`` references, in log order (ranges may repeat). OSError if the log cannot be read."""
    flushed = _flushed_upto(topic_path)
    out: list[tuple[int, int]] = []
    wal_dir = topic_path / "wal"
    if not wal_dir.is_dir():
        return out
    for path in sorted(p for p in wal_dir.iterdir() if p.suffix == ".log" and p.stem.isdigit()):
        for first, count, header in _frames(path.read_bytes()):
            if first + count <= flushed:
                continue
            ref = header[3] if isinstance(header, list) and len(header) > 3 else None
            if not isinstance(ref, dict) or "gen" not in ref:
                continue  # records, or a spooled batch (its own file)
            try:
                if bytes(ref["gen"]) != generation:
                    continue
                out += _ranges(ref, count)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                log.warning("%s: the arena reference of the log frame of index %d is malformed (%s)", path, first, exc)
    return out


def _ranges(ref: dict[str, Any], count: int) -> list[tuple[int, int]]:
    base = int(ref["offset"])
    out = []
    for entry in ref["fields"]:
        offset, nbytes = int(entry[4]), int(entry[5])
        out.append((base + offset, nbytes))
        if entry[1] == jagged.KIND:
            out.append((base + int(entry[6]), (count + 1) * 8))
    return out


def _frames(data: bytes) -> list[tuple[int, int, Any]]:
    """(first index, count, header) of each frame of one log segment, up to its first torn frame."""
    out = []
    pos = 0
    while pos < len(data):
        try:
            frame, end = WriteAheadLog._parse(data, pos)
        except CorruptionError:
            length = _HEADER.unpack_from(data, pos)[4]
            pos += _HEADER.size + length
            continue
        if frame is None:
            break
        out.append((frame.first_index, frame.count, frame.header))
        pos = end
    return out


def _flushed_upto(topic_path: Path) -> int:
    """The topic's ``flushed_upto``; 0 (every frame counts) when ``state.json`` is missing or unreadable."""
    try:
        state = json.loads((topic_path / "state.json").read_text(encoding="utf-8"))
        return int(state.get("flushed_upto", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
