"""Partitions of a topic: listing them with their counts, clearing samples, and the samples' tags.

A mixin of ``engine.Topic`` (like samples.py), on the engine's loop. ``clear(partition, indexes)`` deletes
samples: it is written to the consumption log first (fdatasync'ed when the topic's durability is "sync"), so it
survives a restart, a kill -9 and a power loss like an acknowledged put. From then on the samples are never
handed out, ``get_data``/``check_ready`` of them raise ``ConfigError`` naming them, puts with a ``batch_meta``
naming them are refused, and ``get()``/``stream()`` skip their rows. No other index changes: global indexes are
never shifted or reused.

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
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from ..errors import ConfigError
from ..queue.backend import StorageBackend
from ..wire.codec import OF_KEY
from .consumption import ConsumptionLog
from .gate import ReadGate
from .layout import IndexColumn

if TYPE_CHECKING:
    from .config import TopicConfig
    from .runs import PartitionIndex
    from .samples import Consumption

log = logging.getLogger(__name__)

# A running topic deletes the rows of cleared samples from Lance at most this often (reads pause meanwhile).
PURGE_SPACING_SECONDS = float(os.environ.get("PERSISTING_PURGE_SPACING", "30"))


class Partitions:
    name: str
    visible_upto: int
    config: TopicConfig
    _cleared: set[int]
    _cleared_in: dict[str, set[int]]
    _tags: dict[int, dict[str, Any]]
    _consumption: dict[tuple[str, str], Consumption]
    _consumption_log: ConsumptionLog | None
    flushed_upto: int
    _backends: list[StorageBackend]
    _columns: list[IndexColumn]
    _flush_lock: asyncio.Lock
    _flush_wanted: asyncio.Event
    _read_gate: ReadGate
    _unpurged: set[int]
    _last_purge: float

    if TYPE_CHECKING:  # provided by engine.Topic and samples.Samples

        def _check_open(self) -> None: ...

        async def _partition_index(self) -> dict[str, PartitionIndex]: ...

        @staticmethod
        async def _read_column(backend: StorageBackend, key: str) -> list[Any]: ...

        async def _read_indexes(self, backend: StorageBackend) -> list[Any]: ...

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
        samples = (await self._partition_index()).get(partition)
        visible = self.visible_upto
        unknown = list(indexes) if samples is None else [i for i in indexes if i >= visible or i not in samples]
        if unknown:
            raise ConfigError(f"partition {partition!r} has no samples with global indexes {unknown[:10]}{why}")

    def _log_durably(self, record: list[Any]) -> None:
        """Write a clear or tags record before the call returns (synced too with durability="sync")."""
        if self._consumption_log is not None:
            self._consumption_log.append(record, sync=self.config.durability == "sync")

    async def clear(self, partition: str, indexes: list[int] | None) -> int:
        """Delete samples of ``partition`` (None: every sample it has); returns how many were newly cleared."""
        self._check_open()
        if indexes is None:
            samples = (await self._partition_index()).get(partition)
            visible = [] if samples is None else samples.to_list(samples.below(self.visible_upto))
            targets = [i for i in visible if i not in self._cleared] if self._cleared else visible
        else:
            # Samples this partition cleared already count as cleared (a re-sent clear, say), even once a purge
            # took their rows and with them their place in the partition index.
            done = self._cleared_in.get(partition, set())
            targets = [i for i in dict.fromkeys(indexes) if i not in done]
            await self.check_in_partition(partition, targets)
        if not targets:
            return 0
        self._log_durably(["clear", partition, targets])
        self._cleared.update(targets)
        self._cleared_in.setdefault(partition, set()).update(targets)
        self._unpurged.update(targets)
        self._flush_wanted.set()  # the flush loop schedules the purge
        for (where, _task), state in self._consumption.items():
            if where == partition and state.leased:
                state.leased.release(targets)
        return len(targets)

    async def set_tags(self, partition: str, items: Sequence[tuple[int, dict[str, Any]]]) -> None:
        """Merge tags into samples of ``partition``: ``[(global index, {key: value}), ...]``, values msgpack-safe.
        Durable when it returns; a key set again takes the new value."""
        self._check_open()
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
            self._tags.setdefault(index, {}).update(tags)

    async def partitions(self) -> dict[str, dict[str, Any]]:
        """Per partition: samples (not cleared), cleared, and per task how many it has taken (and holds leased)."""
        self._check_open()
        out: dict[str, dict[str, Any]] = {}
        for partition, samples in (await self._partition_index()).items():
            visible = samples.below(self.visible_upto)
            gone = self._cleared_in.get(partition, set())  # a sample is cleared through its own partition
            cleared = sum(1 for i in gone if i < self.visible_upto and i in samples)
            tasks: dict[str, dict[str, int]] = {}
            for (where, task), state in self._consumption.items():
                if where == partition:
                    taken = len(state.done) - sum(1 for i in gone if i in state.done)
                    tasks[task] = {"consumed": taken, "leased": len(state.leased)}
            out[partition] = {"samples": visible - cleared, "cleared": cleared, "tasks": tasks}
        return out

    def purge_wait(self) -> float | None:
        """Seconds until the next purge is due (0: now); None when no cleared sample's row is in the backends yet
        to be deleted (rows still in the tail wait for their flush, which writes them first)."""
        unpurged = self._unpurged
        if not unpurged or min(unpurged) >= self.flushed_upto:
            return None
        return max(0.0, self._last_purge + PURGE_SPACING_SECONDS - time.monotonic())

    async def purge_if_due(self) -> None:
        """From the flush loop: delete the rows of cleared samples now, if a purge is due (see the docstring)."""
        if self.purge_wait() == 0.0:
            await self._purge_now()

    async def _purge_now(self) -> None:
        async with self._flush_lock, self._read_gate.alone():
            cut = self.flushed_upto
            done = {i for i in self._unpurged if i < cut}
            await self._purge_cleared()
        self._last_purge = time.monotonic()
        # Left for the next purge: samples cleared while this one ran, and those whose rows still waited for a
        # flush when it began.
        self._unpurged -= done

    async def _purge_cleared(self) -> None:
        """Delete the rows of cleared samples (and their patch rows) from the backends that can
        (``delete_rows``), then reload each bucket's index column. At open before any read, or from
        ``_purge_now`` with reads held at the gate."""
        if not self._cleared:
            return
        cleared = np.fromiter(self._cleared, dtype=np.int64, count=len(self._cleared))
        for b, backend in enumerate(self._backends):
            delete = getattr(backend, "delete_rows", None)
            if delete is None:
                continue
            view = self._columns[b].view()
            doomed = [int(i) for i in view[np.isin(view, cleared)]]
            targets = await self._read_column(backend, OF_KEY)
            doomed += [
                int(i) for i, of in zip(view.tolist(), targets, strict=True) if of is not None and of in self._cleared
            ]
            if not doomed:
                continue
            await delete(sorted(set(doomed)))
            self._columns[b] = IndexColumn(await self._read_indexes(backend))
            log.info("topic %r bucket %d: deleted %d rows of cleared samples", self.name, b, len(doomed))
