"""What a check learns about a topic on its way, shared by the checks that come after (read from disk only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..engine.consumption import Replayed
from ..engine.wal import Frame
from ..wire.codec import PARTITION_KEY


@dataclass(slots=True)
class LoggedFrame:
    """An intact frame of the write-ahead log."""

    segment: Path
    start: int  # byte span in its segment
    end: int
    frame: Frame

    @property
    def first(self) -> int:
        return self.frame.first_index

    @property
    def stop(self) -> int:
        return self.frame.first_index + self.frame.count

    def part(self, k: int) -> Any:
        """Item ``k`` of the frame's header ([partition, new kinds, key, ref, patch]), None where absent."""
        header = self.frame.header
        return header[k] if isinstance(header, list) and len(header) > k else None


@dataclass(slots=True)
class BadSpan:
    """Bytes of a log segment that are no intact frame: what its header claims where it has one."""

    segment: Path
    start: int
    end: int
    first: int | None = None
    count: int | None = None


@dataclass(slots=True)
class BucketRows:
    """The engine columns of one bucket in position order (``table``: partition, patch target, key), its index
    column as an array, and its schema."""

    indexes: np.ndarray  # int64, nulls as -1
    table: pa.Table
    schema: pa.Schema

    def column(self, name: str) -> pa.ChunkedArray:
        """One engine column (all nulls where the bucket has none)."""
        if name in self.table.column_names:
            return self.table.column(name)
        return pa.chunked_array([pa.nulls(self.table.num_rows)])

    def partitions_at(self, wanted: np.ndarray) -> dict[int, Any]:
        """The partition of each of ``wanted`` (indexes) that this bucket holds."""
        order = np.argsort(self.indexes, kind="stable")
        ordered = self.indexes[order]
        at = np.searchsorted(ordered, wanted)
        hit = at < len(ordered)
        hit[hit] = ordered[at[hit]] == wanted[hit]
        if not hit.any():
            return {}
        parts = self.column(PARTITION_KEY).take(pa.array(order[at[hit]])).to_pylist()
        return dict(zip(wanted[hit].tolist(), parts, strict=True))


@dataclass(slots=True)
class Facts:
    folder: Path
    name: str
    num_buckets: int = 0
    lance: bool = True  # the topic's backend stores Lance datasets (else its buckets are not read)
    kinds: dict[str, str] = field(default_factory=dict)  # schema.json
    logged_kinds: dict[str, str] = field(default_factory=dict)  # new kinds the log's frames carry
    flushed_upto: int = 0
    log: Replayed = field(default_factory=Replayed)  # what the consumption log says
    frames: list[LoggedFrame] = field(default_factory=list)
    bad: list[BadSpan] = field(default_factory=list)
    buckets: list[BucketRows | None] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # buckets that exist but could not be read

    def stored(self) -> np.ndarray:
        """Every index the buckets hold, sorted (duplicates kept)."""
        parts = [b.indexes for b in self.buckets if b is not None]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def cleared(self) -> set[int]:
        return set().union(*self.log.cleared.values())

    def next_index(self) -> int:
        """One past the largest index the topic knows of (state.json, the buckets, the log)."""
        tops = [self.flushed_upto, *(f.stop for f in self.frames)]
        tops += [int(b.indexes.max()) + 1 for b in self.buckets if b is not None and len(b.indexes)]
        return max(tops)
