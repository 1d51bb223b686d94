"""The sample index of a topic: each partition's samples (as runs of global indexes) and their fields.

Built on first use (a topic that only streams records never pays for it): under the flush lock, so the backends
and the tail hold disjoint rows and none moves between them, it reads the engine columns of every bucket
(partition, index, the sample a patch writes, the fields a row writes), then indexes the tail's chunks. From
then on every chunk added to the tail is indexed at once (``add``).

Patches (fields written later for existing samples, see fields.py) count only once acknowledged: ``add`` queues
them, ``acknowledged`` applies those below ``visible_upto`` in index order (so the latest write wins), and no
sample is handed out with a field that a crash could still lose.

Positions. A sample's position in its partition (what ``get_meta`` passes samplers as ``positions``, what
``GRPOGroupNSampler`` groups by) counts every sample ever put to the partition, cleared ones included: a clear
leaves a hole, never moves a later sample. While the topic runs that is how the index grows (a purge deletes rows
from the backends, never from this index); a build at open, when the purge has taken the cleared samples' rows,
puts them back as holes from the consumption log's clears (partitions.py, kept for ever, through its
compactions), so a sample has the same position before and after a clear, a purge, a reopen and a kill -9. A
partition whose every sample was cleared keeps counting: the next put's samples come after all of them (and
after a reopen too). A hole's field set is its preceding sample's (ANY for holes at the front): it is never
asked for, since cleared samples are dropped before any field is looked at, and copying it keeps one step per
put in the field index.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Collection, Mapping

import numpy as np

from ..wire.codec import FIELDS_KEY, INDEX_KEY, OF_KEY, PARTITION_KEY
from .buckets import Buckets
from .fields import ANY, FieldIndex
from .runs import PartitionIndex, value_runs
from .tail import Chunk, Tail

Cleared = Callable[[], Mapping[str, Collection[int]]]  # partition -> its cleared samples, as they stand now


class SampleIndex:
    def __init__(self, buckets: Buckets, tail: Tail, flush_lock: asyncio.Lock, cleared: Cleared) -> None:
        self._buckets = buckets
        self._cleared = cleared  # asked at the build: the cleared samples, whose rows a purge may have taken
        self._tail = tail
        self._flush_lock = flush_lock
        self._partitions: dict[str, PartitionIndex] | None = None  # partition -> its global indexes, as runs
        self._fields = FieldIndex()  # own fields and patches of the samples, built with _partitions
        self._pending: collections.deque[Chunk] = collections.deque()  # patches not yet acknowledged

    @property
    def fields(self) -> FieldIndex:
        """The field index as it stands (field-set ids for the flush; complete once ``partitions`` was built)."""
        return self._fields

    async def partitions(self) -> dict[str, PartitionIndex]:
        built = self._partitions
        if built is not None:
            return built
        async with self._flush_lock:
            if self._partitions is None:
                await self._build()
        if self._partitions is None:  # for the type checker: _build sets it
            raise RuntimeError("the sample index was not built")
        return self._partitions

    async def field_index(self) -> FieldIndex:
        """Own fields and patches of every sample (built with the partition index on first use)."""
        await self.partitions()
        return self._fields

    async def _build(self) -> None:
        fields = FieldIndex()
        found: dict[str, tuple[list[int], list[int]]] = {}  # partition -> (indexes, field set ids)
        patches: list[tuple[int, int, int]] = []  # (patch row, sample it writes, field set id)
        for parts, indexes, targets, names in await self._buckets.columns(PARTITION_KEY, INDEX_KEY, OF_KEY, FIELDS_KEY):
            for partition, index, of, raw in zip(parts, indexes, targets, names, strict=True):
                if of is None:
                    pair = found.get(str(partition))
                    if pair is None:
                        pair = found[str(partition)] = ([], [])
                    pair[0].append(int(index))
                    pair[1].append(fields.intern_json(raw))
                else:
                    patches.append((int(index), int(of), fields.intern_json(raw)))
        partitions: dict[str, PartitionIndex] = {}
        cleared = self._cleared()
        for partition in dict.fromkeys([*found, *cleared]):
            found_indexes, ids = found.get(partition, ([], []))
            ordered, set_ids = with_holes(
                np.asarray(found_indexes, dtype=np.int64),
                np.asarray(ids, dtype=np.int64),
                cleared.get(partition, ()),
                self._tail.flushed_upto,
            )
            if len(ordered):
                partitions[partition] = PartitionIndex.of(ordered)
                fields.add_runs(partition, value_runs(set_ids))
        for index, of, set_id in sorted(patches):
            fields.patch(index, [of], sorted(fields.sets[set_id]))
        self._fields = fields
        self._partitions = partitions
        for chunk in self._tail.chunks:
            self.add(chunk)

    def add(self, chunk: Chunk) -> None:
        """Index a chunk just added to the tail: its samples, or a patch's writes (nothing before the build)."""
        if self._partitions is None or not chunk.count:
            return
        if chunk.of is not None:
            self._pending.append(chunk)
            self.acknowledged()
            return
        index = self._partitions.get(chunk.partition)
        if index is None:
            index = self._partitions[chunk.partition] = PartitionIndex()
        index.append(chunk.first, chunk.count)
        # What Chunk.own_fields_id gives each row, as runs: one step for a put whose rows share their fields.
        extra = tuple(chunk.arena.columns) if chunk.arena is not None else ()
        self._fields.add_runs(chunk.partition, self._fields.rows_ids(chunk.other, extra))

    def acknowledged(self) -> None:
        """Count the pending patches that are acknowledged now (in index order, so the latest write wins)."""
        pending, visible = self._pending, self._tail.visible_upto
        while pending and pending[0].first + pending[0].count <= visible:
            chunk = pending.popleft()
            if chunk.of is not None:
                self._fields.patch(chunk.first, chunk.of, chunk.patch_fields)


def with_holes(
    indexes: np.ndarray, set_ids: np.ndarray, cleared: Collection[int], below: int
) -> tuple[np.ndarray, np.ndarray]:
    """A partition's samples found in the backends (global indexes, their field-set ids; any order) with its
    cleared samples below ``below`` (the rows in the backends; those above are in the tail, indexed from there)
    that are not among them put back (their rows were purged), ascending: every sample keeps its position."""
    holes = np.fromiter((i for i in cleared if i < below), dtype=np.int64)
    if len(holes):
        holes = holes[~np.isin(holes, indexes)]
    if not len(holes):
        order = np.argsort(indexes, kind="stable")
        return indexes[order], set_ids[order]
    merged = np.concatenate((indexes, holes))
    ids = np.concatenate((set_ids, np.full(len(holes), -1, dtype=np.int64)))
    order = np.argsort(merged, kind="stable")
    merged, ids = merged[order], ids[order]
    known = ids >= 0
    if not known.any():
        return merged, np.full(len(ids), ANY, dtype=np.int64)
    # Each hole takes the field set of the sample before it (the front ones that of the first sample found).
    source = np.maximum.accumulate(np.where(known, np.arange(len(ids)), -1))
    source[source < 0] = int(np.flatnonzero(known)[0])
    return merged, ids[source]
