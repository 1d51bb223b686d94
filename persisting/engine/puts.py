"""The put path of a topic: indexes, the log frame, the group commit, and retried puts' keys.

``Appender`` is composed into ``topic.Topic``, on the engine's loop. Life of a put: validate and encode (caller's
thread) -> assign indexes and write one log frame (atomic on the loop: nothing awaits between them) -> group
commit (one fdatasync for every waiting put) -> visible to readers -> acknowledged. A put carrying a key that was
stored already (before a restart too: the key travels in its log frame) returns the first result instead.

A put with ``durable=False`` (a record whose loss in a power loss changes no outcome, see the persist-queue layer's
UNACK records) waits for no fdatasync of its own: its frame is written (so it survives kill -9) and the next sync
of the log covers it. It becomes visible once every durable put before it is synced (at once when none waits), so
readers see the log in order and never see a record past a durable put that a power loss could still take away.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, QueueClosedError
from ..tensors.dedup import PAYLOAD_PARTITION_PREFIX
from ..wire.codec import EncodedBatch
from .args import check_key
from .config import Metrics, TopicConfig
from .flushing import IDEMPOTENCY_WINDOW_SECONDS, Flusher
from .index import SampleIndex
from .partitions import Clears
from .payloads import check_ways, ref_names
from .schema import Schema
from .tail import ArenaPayload, Chunk, Tail
from .wal import WriteAheadLog

# Keys of puts, remembered so that a retried put is stored once (docs/concepts/safe-retries.md): every key
# younger than IDEMPOTENCY_KEY_SECONDS and at least the newest IDEMPOTENCY_KEYS_KEPT, never more than
# IDEMPOTENCY_KEYS_MAX (memory: about 250 bytes a key). Across a restart the keys come back from the log, whose
# flushed segments are kept that long too.
IDEMPOTENCY_KEY_SECONDS = IDEMPOTENCY_WINDOW_SECONDS
IDEMPOTENCY_KEYS_KEPT = 65_536
IDEMPOTENCY_KEYS_MAX = 262_144


class Appender:
    def __init__(
        self,
        name: str,
        config: TopicConfig,
        tail: Tail,
        schema: Schema,
        index: SampleIndex,
        clears: Clears,
        flusher: Flusher,
        metrics: Metrics,
        accepting: Callable[[], None],
    ) -> None:
        self._name = name
        self._config = config
        self._tail = tail
        self._schema = schema
        self._index = index
        self._clears = clears
        self._flusher = flusher
        self._metrics = metrics
        self._accepting = accepting  # raises QueueClosedError once the topic is closing
        self._wal: WriteAheadLog | None = None
        self._durable_frames = 0  # frames appended up to the last durable put's (what a durable=False put waits for)
        # idempotency key -> (first, count, monotonic time remembered), oldest first
        self._recent: OrderedDict[str, tuple[int, int, float]] = OrderedDict()
        # the last kinds found plain (no new field, no payload reference), and the schema they were checked against
        self._known_kinds: tuple[dict[str, str], dict[str, str], int] | None = None

    def start(self, wal: WriteAheadLog) -> None:
        """Append to ``wal`` from now on (after the replay)."""
        self._wal = wal

    def remember(self, key: str, first: int, n: int) -> None:
        """A put stored under ``key`` got ``(first, n)`` (also from the replay of its log frame)."""
        now = time.monotonic()
        self._recent[key] = (first, n, now)
        recent = self._recent
        while len(recent) > IDEMPOTENCY_KEYS_KEPT:
            oldest = next(iter(recent.values()))
            if len(recent) <= IDEMPOTENCY_KEYS_MAX and now - oldest[2] < IDEMPOTENCY_KEY_SECONDS:
                break
            recent.popitem(last=False)

    async def _check_targets(self, partition: str, targets: list[int], n: int) -> None:
        """The samples a patch writes to must be acknowledged samples of its partition, each named once."""
        if len(targets) != n:
            raise ConfigError(f"this put writes {n} samples but its batch_meta names {len(targets)}")
        if len(set(targets)) != len(targets):
            raise ConfigError("a batch_meta names the same sample twice; one put writes a sample's fields once")
        why = ": a put with batch_meta writes fields of samples that exist (pass the BatchMeta of put or get_meta)"
        await self._clears.check_in_partition(partition, targets, why)
        self._clears.check_not_cleared(targets)

    async def append(
        self,
        batch: EncodedBatch,
        partition: str,
        rows_blob: bytes,
        key: str | None = None,
        arena: ArenaPayload | None = None,
        of: list[int] | None = None,
        durable: bool = True,
    ) -> tuple[int, int]:
        """Store encoded rows durably; returns (first global index, count) once acknowledged (``durable=False``:
        once written and every frame before it is synced, see the module doc).

        ``key`` makes a retry idempotent: a batch whose key was stored already (even before a restart: the key
        travels in its log frame) is not stored again, and the first result is returned.

        ``of``: a patch. Row k writes its fields for the existing sample ``of[k]`` of ``partition`` (see
        fields.py); the rows get indexes of their own, which are not samples.
        """
        patch = None
        if of is not None:
            patch = (list(of), sorted(batch.kinds))
            await self._check_targets(partition, patch[0], len(batch.rows))
        if key is not None:
            check_key(key)
            done = self._recent.get(key)
            if done is not None:
                if done[1] != len(batch.rows):
                    raise ConfigError(
                        f"idempotency key {key[:64]!r} was used by a put of {done[1]} samples, this put has "
                        f"{len(batch.rows)}; a key names one put (pass a new key, or none, for a different batch)"
                    )
                if self._wal is not None:
                    await self._wal.commit()  # the first attempt may still be waiting for its sync
                return done[0], done[1]
        wal = self._wal
        if wal is None:
            raise QueueClosedError(f"topic {self._name!r} is not open")
        self._accepting()  # close() takes what is in the log when it starts, and nothing after
        plain = self._plain_kinds(batch.kinds, partition)
        new_kinds = {} if plain else self._new_kinds(batch.kinds, partition)
        n = len(batch.rows)
        tail = self._tail
        if n == 0:
            return tail.next_index, 0
        # From here to the commit nothing awaits: indexes, kinds and the frame land together, and the payload
        # rows this put references stay live (a clear cannot run in between, see payloads.py).
        payloads = self._clears.payloads
        if not plain:  # (plain kinds reference no payload row: nothing to check or count)
            payloads.check(partition, batch.rows, batch.kinds)
        first = tail.assign(n)
        if not plain:
            payloads.add(partition, first, batch.rows, batch.kinds, None if patch is None else patch[0])
        header: list[Any] = [partition, new_kinds, key]
        if arena is not None or patch is not None:
            header.append(None if arena is None else arena.ref)
        if patch is not None:
            header.append([patch[0], patch[1]])
        wal.append(first, n, header, rows_blob)
        if durable:
            self._durable_frames = wal.written
        if key is not None:
            self.remember(key, first, n)
        self._schema.add(new_kinds)
        chunk = Chunk(first, partition, batch.rows, arena, patch=patch)
        tail.add(chunk)
        self._index.add(chunk)
        if wal.sync:  # (a log that is never synced, durability="process", has nothing to wait for)
            t0 = time.perf_counter()
            await wal.commit(None if durable else self._durable_frames)
            self._metrics.commit_seconds += time.perf_counter() - t0
        if tail.acknowledge(first + n):
            self._index.acknowledged()
        self._metrics.puts += 1
        self._metrics.records_put += n
        if arena is not None:
            self._flusher.arena_put()
        elif tail.visible_upto - tail.flushed_upto >= self._config.batch_size:
            self._flusher.want()
        return first, n

    def _plain_kinds(self, kinds: dict[str, str], partition: str) -> bool:
        """Whether ``kinds`` were checked already against this schema as it is now, and found to add no field,
        to conflict with none and to reference no payload row: a producer puts the same kinds put after put, so
        the checks below run once per schema (the schema only grows: its length tells whether it changed)."""
        known = self._known_kinds
        schema = self._schema.kinds
        return (
            known is not None
            and known[1] is schema
            and known[2] == len(schema)
            and kinds == known[0]
            and not partition.startswith(PAYLOAD_PARTITION_PREFIX)
        )

    def _new_kinds(self, kinds: dict[str, str], partition: str) -> dict[str, str]:
        """The kinds a put adds to the schema (``SchemaConflictError``, ``DedupConflictError`` for a conflict);
        kinds found plain (see ``_plain_kinds``) are remembered."""
        new_kinds = self._schema.new_kinds(kinds)
        new_kinds.update(check_ways(partition, kinds, self._schema.kinds))
        if not new_kinds and not ref_names(kinds) and not partition.startswith(PAYLOAD_PARTITION_PREFIX):
            schema = self._schema.kinds
            self._known_kinds = (dict(kinds), schema, len(schema))
        return new_kinds

    async def recall(self, key: str) -> tuple[int, int] | None:
        """The result of the put_batch stored under ``key`` (once acknowledged), or None if there was none."""
        found = self._recent.get(key)
        if found is None:
            return None
        if self._wal is not None:
            await self._wal.commit()  # the first attempt may still be waiting for its sync
        return found[0], found[1]
