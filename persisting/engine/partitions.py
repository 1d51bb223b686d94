"""Partitions of a topic: listing them with their counts, clearing samples, and the samples' tags.

``Clears`` is composed into ``topic.Topic``, on the engine's loop. ``clear(partition, indexes)`` deletes
samples: it is written to the consumption log first (fdatasync'ed when the topic's durability is "sync"), so it
survives a restart, a kill -9 and a power loss like an acknowledged put. From then on the samples are never
handed out, ``get_data``/``check_ready`` of them raise ``ConfigError`` naming them, puts with a ``batch_meta``
naming them are refused, and ``get()``/``stream()`` skip their rows. No other index changes: global indexes are
never shifted or reused, and neither are positions (a cleared sample stays in the sample index as a hole, after a
purge and a reopen too: index.py).

Space: the rows of cleared samples (and the patch rows that wrote their fields) are deleted from the backends
(``delete_rows``) by a purge: while the topic runs, by the background flush loop at most once per
``PURGE_SPACING_SECONDS`` when samples were cleared; at a clean close; and at the next open (after a crash),
before anything reads. A delete moves the positions of the rows after it, so a running purge holds the flush
lock, stops new reads at the gate (``gate.ReadGate``) and waits for the reads in flight to finish; reads wait
for it (one Lance delete per bucket and a reload of its index column: milliseconds to tens of milliseconds).
Lance's compaction and version cleanup then give the disk space back. Their arena extents are recycled like any
other once flushed.

Tags (``custom_meta``): ``set_tags`` merges ``{key: value}`` maps into samples' tags, written to the consumption
log like a clear before it returns; ``describe`` hands them out with the samples, so every process sees them
and they survive a restart. A cleared sample's tags go at the next compaction of the log.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgpack

from ..errors import ConfigError
from ..tensors.dedup import PAYLOAD_PARTITION_PREFIX, payload_partition
from .buckets import Buckets
from .config import TopicConfig
from .consumption import ConsumptionLog
from .gate import ReadGate
from .index import SampleIndex
from .payloads import PayloadRefs
from .runs import PartitionIndex
from .tail import Tail

# A running topic deletes the rows of cleared samples from Lance at most this often (reads pause meanwhile).
PURGE_SPACING_SECONDS = float(os.environ.get("PERSISTING_PURGE_SPACING", "30"))


class Clears:
    """Cleared samples, the samples' tags, and the purge of cleared rows; their one owner."""

    def __init__(
        self,
        config: TopicConfig,
        log: ConsumptionLog,
        index: SampleIndex,
        tail: Tail,
        buckets: Buckets,
        flush_lock: asyncio.Lock,
    ) -> None:
        self._config = config
        self._log = log
        self._index = index
        self._tail = tail
        self._buckets = buckets
        self._flush_lock = flush_lock
        self._cleared: set[int] = set()  # samples deleted by clear()
        self._cleared_in: dict[str, set[int]] = {}  # the same, per partition
        self.tags: dict[int, dict[str, Any]] = {}  # global index -> the sample's tags
        self._gate = ReadGate()  # reads of backend positions share it; a purge takes it alone
        self._unpurged: set[int] = set()  # cleared samples whose rows may still be in the backends
        self._last_purge = 0.0  # time.monotonic() of the last purge
        self.payloads = PayloadRefs(buckets, tail)  # payload rows of deduped fields, cleared with their last sample

    def load(self) -> None:
        """At open: what the consumption log holds (it was replayed by ``ConsumptionLog.open``)."""
        self._cleared_in = {p: set(indexes) for p, indexes in self._log.cleared.items()}
        self._cleared = set().union(*self._cleared_in.values())
        self.tags = {i: tags for tagged in self._log.tags.values() for i, tags in tagged.items()}

    async def load_payloads(self, kinds: dict[str, str]) -> None:
        """At open, after the replay and before the purge: rebuild the payload references and clear the payload
        rows nothing references (left by a crash between a clear and its payloads' clear, or by a producer)."""
        for partition, rows in (await self.payloads.rebuild(self._cleared, kinds)).items():
            self._clear_logged((payload_partition(partition), rows))

    @property
    def cleared(self) -> set[int]:
        """Every cleared sample (read only: the caller must not change it)."""
        return self._cleared

    @property
    def by_partition(self) -> dict[str, set[int]]:
        """Partition -> its cleared samples (read only): the sample index puts back the purged ones as holes."""
        return self._cleared_in

    def partitions(self) -> list[str]:
        """The partitions that had samples cleared (known from the consumption log after a purge too)."""
        return list(self._cleared_in)

    def cleared_in(self, partition: str) -> set[int] | None:
        return self._cleared_in.get(partition)

    def reading(self) -> AbstractAsyncContextManager[None]:
        """Enter before mapping global indexes to backend positions; a purge waits for the reads in flight."""
        return self._gate.reading()

    def not_cleared(self, indexes: list[int]) -> list[int]:
        """``indexes`` without the cleared samples (a take's answer: one cleared since it was taken is gone)."""
        cleared = self._cleared
        return [i for i in indexes if i not in cleared] if cleared else indexes

    def check_not_cleared(self, indexes: list[int]) -> None:
        if self._cleared:
            gone = [i for i in indexes if i in self._cleared]
            if gone:
                raise ConfigError(f"samples with global indexes {gone[:10]} were cleared (clear()); they have no data")

    async def check_in_partition(self, partition: str, indexes: Sequence[int], why: str = "") -> None:
        """Raise ``ConfigError`` naming the indexes that are not acknowledged samples of ``partition``."""
        samples = (await self._index.partitions()).get(partition)
        visible = self._tail.visible_upto
        unknown = list(indexes) if samples is None else [i for i in indexes if i >= visible or i not in samples]
        if unknown:
            raise ConfigError(f"partition {partition!r} has no samples with global indexes {unknown[:10]}{why}")

    def _log_durably(self, *records: list[Any]) -> None:
        """Write clear or tags records before the call returns (synced too with durability="sync")."""
        self._log.append(*records, sync=self._config.durability == "sync")

    async def clear(self, partition: str, indexes: list[int] | None) -> list[int]:
        """Delete samples of ``partition`` (None: every sample it has); returns the newly cleared ones. Payload
        rows of deduped fields that no live sample references any more are cleared with them (payloads.py)."""
        if partition.startswith(PAYLOAD_PARTITION_PREFIX):
            raise ConfigError(
                f"partition {partition!r} holds the stored values of deduped fields; they are cleared with the last "
                f"sample that references them: clear samples of {partition[len(PAYLOAD_PARTITION_PREFIX) :]!r}"
            )
        if indexes is None:
            samples = (await self._index.partitions()).get(partition)
            visible = [] if samples is None else samples.to_list(samples.below(self._tail.visible_upto))
            targets = [i for i in visible if i not in self._cleared] if self._cleared else visible
        else:
            # Samples this partition cleared already count as cleared (a re-sent clear, say), even once a purge
            # took their rows and with them their place in the partition index.
            done = self._cleared_in.get(partition, set())
            targets = [i for i in dict.fromkeys(indexes) if i not in done]
            await self.check_in_partition(partition, targets)
        # From here on nothing awaits: the samples' clear and their payloads' clear are one step for puts, and
        # one write to the log, the samples' record first (a crash may leave the payloads' clear to the open).
        gone = self.payloads.release(partition, targets, whole=indexes is None)
        self._clear_logged((partition, targets), (payload_partition(partition), gone))
        return targets

    def _clear_logged(self, *clears: tuple[str, list[int]]) -> None:
        clears = tuple((partition, targets) for partition, targets in clears if targets)
        if not clears:
            return
        self._log_durably(*(["clear", partition, targets] for partition, targets in clears))
        for partition, targets in clears:
            self._cleared.update(targets)
            self._cleared_in.setdefault(partition, set()).update(targets)
            self._unpurged.update(targets)

    async def set_tags(self, partition: str, items: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Merge tags into samples of ``partition``: ``[(global index, {key: value}), ...]``, values msgpack-safe.
        Durable when it returns; a key set again takes the new value."""
        indexes = [index for index, _ in items]
        await self.check_in_partition(partition, indexes)
        self.check_not_cleared(indexes)
        record: list[tuple[int, dict[str, Any]]] = []
        for index, tags in items:
            if not isinstance(tags, dict) or not all(isinstance(k, str) for k in tags):
                raise ConfigError(f"the tags of sample {index} must be a dict with str keys, got {tags!r}")
            try:  # a copy through msgpack: what the broker would store, nothing shared with the caller
                tags = msgpack.unpackb(msgpack.packb(tags), raw=False)
            except (TypeError, ValueError, OverflowError) as exc:
                raise ConfigError(
                    f"the tags of sample {index} must be msgpack-safe (str, int, float, bool, None, bytes, lists "
                    f"and dicts of them): {exc}"
                ) from exc
            if tags:
                record.append((index, tags))
        if not record:
            return
        self._log_durably(["tags", partition, record])
        for index, tags in record:
            self.tags.setdefault(index, {}).update(tags)

    def counts(self, partition: str, samples: PartitionIndex) -> tuple[int, int]:
        """(samples not cleared, samples ever cleared) of a partition, among the acknowledged ones. The cleared
        count comes from the consumption log, so a purge or a restart does not change it; ``samples`` holds the
        cleared ones too (as holes once purged, index.py), but one whose row was lost is not counted off twice."""
        visible_upto = self._tail.visible_upto
        visible = samples.below(visible_upto)
        gone = self._cleared_in.get(partition, set())  # a sample is cleared through its own partition
        indexed = sum(1 for i in gone if i < visible_upto and i in samples)  # cleared and indexed (as holes too)
        return visible - indexed, len(gone)

    # -- the purge ----------------------------------------------------------------------------------

    def wait(self) -> float | None:
        """Seconds until the next purge is due (0: now); None when no cleared sample's row is in the backends yet
        to be deleted (rows still in the tail wait for their flush, which writes them first)."""
        unpurged = self._unpurged
        if not unpurged or min(unpurged) >= self._tail.flushed_upto:
            return None
        return max(0.0, self._last_purge + PURGE_SPACING_SECONDS - time.monotonic())

    async def run_if_due(self) -> None:
        """From the flush loop: delete the rows of cleared samples now, if a purge is due (see the docstring)."""
        if self.wait() == 0.0:
            await self.purge_now()

    async def purge_now(self) -> None:
        if not self._unpurged:
            return
        async with self._flush_lock, self._gate.alone():
            cut = self._tail.flushed_upto
            done = {i for i in self._unpurged if i < cut}
            await self.purge_unread()
        self._last_purge = time.monotonic()
        # Left for the next purge: samples cleared while this one ran, and those whose rows still waited for a
        # flush when it began.
        self._unpurged -= done

    async def purge_unread(self) -> None:
        """Delete the rows of cleared samples (and their patch rows) from the backends. At open before any read,
        or from ``purge_now`` with reads held at the gate."""
        if self._cleared:
            await self._buckets.purge(self._cleared)
