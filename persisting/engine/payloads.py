"""Payload rows of deduped fields (tensors/dedup.py) live exactly as long as a live sample references them.

``PayloadRefs`` is composed into ``partitions.Clears`` (which logs its clears) and used by ``puts.Appender``, on
the engine's loop; it is the one owner of which payload rows are live and how many samples reference each.

Rule: a payload row (a row of the partition ``payload_partition(p)``) is cleared, and later purged from Lance like
any cleared row, once no sample of ``p`` that is put (acknowledged or in flight) and not cleared references it:

- a clear of samples drops their references (each sample's own row and its patches); rows left with none are
  cleared in the same step, with no await between (``Clears.clear``): a put cannot slip in between;
- a clear of the whole of ``p`` also clears the payload rows no sample references yet (a producer that stored
  one but not its samples has its sample put refused, and stores the value again);
- a put whose ``<name>@payload`` names a row that is not live (cleared, or never a payload row of ``p``) is
  refused with ``PayloadClearedError`` before it gets an index (the client forgets its content index of ``p``
  and stores the values again), so no reference ever names a cleared row;
- a field is stored one way per topic (``check_ways``): a payload put declares the field's references
  (``<name>@payload``) in the schema in its own frame, so from its first payload row on every process sees the
  field as deduped; a put storing a field the other way is refused with ``DedupConflictError``, and one holding
  a ``<name>@payload`` field that no payload put declared (a user's own key: clients refuse them before they
  send) with ``InvalidRecordError``;
- at open the counts are rebuilt from what is stored (the backends' columns and the log's tail, less the
  cleared samples) and payload rows that nothing references are cleared: a crash between a sample clear (logged
  first) and its payloads' clear, or between a producer's payload put and its samples, converges there.

A reference written by a patch that replaced an earlier one keeps the earlier row until the sample is cleared
(dropping it at the patch could clear it before the patch's frame is durable); the rebuild at open counts the
sample's rows alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import DedupConflictError, InvalidRecordError, PayloadClearedError
from ..tensors.dedup import PAYLOAD_PARTITION_PREFIX, REF_KIND, REF_SUFFIX
from ..wire.codec import INDEX_KEY, OF_KEY, PARTITION_KEY, RESERVED_PREFIX
from .buckets import Buckets
from .tail import Tail


def ref_names(kinds: Iterable[str]) -> list[str]:
    """The reference fields among ``kinds``' names."""
    return [k for k in kinds if k.endswith(REF_SUFFIX)]


def check_ways(partition: str, given: Iterable[str], stored: Mapping[str, str]) -> dict[str, str]:
    """Refuse a put that stores a field the other way than the topic does (``stored``: the schema's kinds), and
    return the reference kinds a payload put declares (with its first payload row of a field, in its frame).

    Why declare: a payload row holds the value under the field's own name, so between a producer's first payload
    put and its first sample put the schema held ``<name>`` alone, which reads as a plain field; a second producer
    deciding ``dedup="auto"`` then stored the field plain, and reads of the field by name dropped those samples.
    """
    if partition.startswith(PAYLOAD_PARTITION_PREFIX):
        declared: dict[str, str] = {}
        for name in given:
            if name.startswith(RESERVED_PREFIX) or name.endswith(REF_SUFFIX) or name + REF_SUFFIX in stored:
                continue
            if name in stored:
                raise DedupConflictError(
                    f"field {name!r} is stored plain in this topic and this put would store it deduped; a topic "
                    f"stores a field one way: put it with a Queue whose dedup leaves {name!r} out (or dedup='auto')",
                    name,
                    False,
                )
            declared[name + REF_SUFFIX] = REF_KIND
        return declared
    for name in given:
        if name.endswith(REF_SUFFIX) and stored.get(name) != REF_KIND:
            # A reference is declared by its field's first payload put (above): this name is a user's own field.
            raise InvalidRecordError(
                f"field {name!r} ends with {REF_SUFFIX!r} (reserved for the queue: the references of deduped "
                "fields); rename it"
            )
        if not name.endswith(REF_SUFFIX) and name + REF_SUFFIX in stored:
            raise DedupConflictError(
                f"field {name!r} is stored deduped in this topic (references {name + REF_SUFFIX!r}) and this put "
                f"would store it plain; a topic stores a field one way: put it with a Queue whose dedup names "
                f"{name!r} (or dedup='auto')",
                name,
                True,
            )
    return {}


def _refs(row: Mapping[str, Any], names: Sequence[str]) -> list[int]:
    return [int(v) for name in names if (v := row.get(name)) is not None]


class PayloadRefs:
    def __init__(self, buckets: Buckets, tail: Tail) -> None:
        self._buckets = buckets
        self._tail = tail
        # sample partition -> payload row -> references from samples not cleared; a row is here while it is live
        self._live: dict[str, dict[int, int]] = {}
        # sample -> the payload row it references, or the rows (several fields, or patches): an int for most
        self._held: dict[int, int | list[int]] = {}

    # -- puts (Appender.append, with no await between check and add) ---------------------------------

    def check(self, partition: str, rows: Sequence[Mapping[str, Any]], kinds: Iterable[str]) -> None:
        """Refuse a put that references a payload row of ``partition`` that is not live."""
        names = ref_names(kinds)
        if not names or partition.startswith(PAYLOAD_PARTITION_PREFIX):
            return
        live = self._live.get(partition, {})
        gone = sorted({r for row in rows for r in _refs(row, names) if r not in live})
        if gone:
            raise PayloadClearedError(
                f"this put into partition {partition!r} references payload rows {gone[:10]} of deduped fields that "
                "were cleared (no live sample referenced them) or never were payloads of this partition; store the "
                "values again (a Queue with dedup does so by itself)",
                gone,
            )

    def add(
        self, partition: str, first: int, rows: Sequence[Mapping[str, Any]], kinds: Iterable[str], of: list[int] | None
    ) -> None:
        """Count a put's references (``of``: a patch's rows reference for those samples), or register a payload
        put's rows (live, no reference yet)."""
        if partition.startswith(PAYLOAD_PARTITION_PREFIX):
            live = self._live.setdefault(partition[len(PAYLOAD_PARTITION_PREFIX) :], {})
            for i in range(first, first + len(rows)):
                live[i] = 0
            return
        names = ref_names(kinds)
        if names:
            self._count(partition, names, [(first + k if of is None else of[k], row) for k, row in enumerate(rows)])

    def _count(self, partition: str, names: Sequence[str], rows: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        live = self._live.get(partition)
        if live is None:
            return
        for sample, row in rows:
            for r in _refs(row, names):  # live: check() said so, with no await since
                live[r] += 1
                self._hold(sample, r)

    def _hold(self, sample: int, row: int) -> None:
        had = self._held.get(sample)
        if had is None:
            self._held[sample] = row
        elif isinstance(had, int):
            self._held[sample] = [had, row]
        else:
            had.append(row)

    # -- clears (Clears.clear, in the step that logs the samples' clear) ------------------------------

    def release(self, partition: str, samples: Sequence[int], whole: bool) -> list[int]:
        """Drop the references of cleared ``samples`` of ``partition``; returns the payload rows left with none,
        no longer live (the caller logs their clear). ``whole``: the whole partition was cleared, so every
        acknowledged payload row without references goes too."""
        live = self._live.get(partition)
        if live is None:
            return []
        gone: list[int] = []
        for sample in samples:
            had = self._held.pop(sample, None)
            for r in () if had is None else (had,) if isinstance(had, int) else had:
                left = live.get(r)
                if left is None:
                    continue
                if left <= 1:
                    del live[r]
                    gone.append(r)
                else:
                    live[r] = left - 1
        if whole:
            visible = self._tail.visible_upto
            idle = [r for r, n in live.items() if n == 0 and r < visible]
            for r in idle:
                del live[r]
            gone.extend(idle)
        return sorted(gone)

    # -- open ---------------------------------------------------------------------------------------

    async def rebuild(self, cleared: set[int], kinds: Iterable[str]) -> dict[str, list[int]]:
        """At open, after the replay: the counts from the stored rows (backends and tail) less ``cleared``;
        returns the payload rows no live sample references, per sample partition (the caller clears them)."""
        self._live, self._held = {}, {}
        names = ref_names(kinds)
        if not names:
            return {}
        blocks = await self._buckets.columns(PARTITION_KEY, INDEX_KEY, OF_KEY, *names)
        for chunk in self._tail.chunks:
            targets = chunk.of if chunk.of is not None else [None] * chunk.count
            refs = [[row.get(name) for row in chunk.other] for name in names]
            blocks.append(
                [[chunk.partition] * chunk.count, list(range(chunk.first, chunk.first + chunk.count)), targets, *refs]
            )
        # Two passes over plain columns (every row of the topic: nothing made per row but the counts).
        prefix, cut, live_of = PAYLOAD_PARTITION_PREFIX, len(PAYLOAD_PARTITION_PREFIX), self._live
        for parts, indexes, targets, *_refs in blocks:
            for part, index, of in zip(parts, indexes, targets, strict=True):
                if of is None and part.startswith(prefix) and index not in cleared:
                    live_of.setdefault(part[cut:], {})[index] = 0
        for parts, indexes, targets, *columns in blocks:
            for column in columns:
                for part, index, of, ref in zip(parts, indexes, targets, column, strict=True):
                    if ref is None:
                        continue
                    sample = index if of is None else of
                    live = live_of.get(part)
                    # a row not live was cleared, and purged: so was every sample naming it
                    if live is None or ref not in live or sample in cleared:
                        continue
                    live[ref] += 1
                    self._hold(sample, ref)
        orphans: dict[str, list[int]] = {}
        for part, live in live_of.items():
            unreferenced = sorted(r for r, n in live.items() if n == 0)
            for r in unreferenced:
                del live[r]
            if unreferenced:
                orphans[part] = unreferenced
        return orphans
