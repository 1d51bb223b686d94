"""Samples of a topic: partitions, consume-on-fetch, and where tensor fields lie (for get_meta/get_data).

A mixin of ``engine.Topic``, kept apart so that the engine module stays about storage. The state it reads is
the Topic's (declared below for the type checker); like the rest of the engine, it runs on the engine's loop.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from .arena import Peer, peer_alive
from .codec import RESERVED_PREFIX, decode_sample
from .consumption import ConsumptionLog
from .errors import ConfigError
from .layout import INDEX_KEY, PARTITION_KEY
from .queue.backend import StorageBackend
from .samplers import RANK_CACHE_SIZE, Sampler, SequentialSampler
from .tail import Chunk


class Consumption:
    """What one task has taken from one partition (``done``); every sample at a position below ``floor`` of the
    partition's index list is in it (so scans start there)."""

    __slots__ = ("done", "floor", "leased")

    def __init__(self, done: set[int] | None = None) -> None:
        self.floor = 0
        self.done: set[int] = done if done is not None else set()
        # acknowledged delivery: index -> (loop time the lease ends, the process holding it or None)
        self.leased: dict[int, tuple[float, Peer | None]] = {}

    def expire(self, now: float) -> float | None:
        """Drop leases that ended or whose holder died; returns when the next one ends (None: none left)."""
        alive: dict[Peer, bool] = {}
        nearest = None
        for index, (until, holder) in list(self.leased.items()):
            if holder is not None and holder not in alive:
                alive[holder] = peer_alive(holder)
            if until <= now or (holder is not None and not alive[holder]):
                del self.leased[index]
            elif nearest is None or until < nearest:
                nearest = until
        return nearest


class Samples:
    name: str
    kinds: dict[str, str]
    visible_upto: int
    flushed_upto: int
    _partitions: dict[str, list[int]] | None
    _consumption: dict[tuple[str, str], Consumption]
    _consumption_log: ConsumptionLog | None
    _rank_cache: OrderedDict[tuple[Any, ...], list[int]]
    _flush_lock: asyncio.Lock
    _backends: list[StorageBackend]
    _tail: list[Chunk]
    _tail_firsts: list[int]
    _resident: list[Chunk]
    _resident_firsts: list[int]
    _changed: asyncio.Event

    if TYPE_CHECKING:  # provided by engine.Topic

        def _check_open(self) -> None: ...

        async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]: ...

        @staticmethod
        async def _read_column(backend: StorageBackend, key: str) -> list[Any]: ...

    async def _partition_index(self) -> dict[str, list[int]]:
        if self._partitions is None:
            # Under the flush lock, the backends and the tail hold disjoint rows and none moves between them.
            async with self._flush_lock:
                if self._partitions is None:
                    found: dict[str, list[int]] = {}
                    for backend in self._backends:
                        parts = await self._read_column(backend, PARTITION_KEY)
                        indexes = await self._read_column(backend, INDEX_KEY)
                        for partition, index in zip(parts, indexes, strict=True):
                            found.setdefault(str(partition), []).append(int(index))
                    for indexes in found.values():
                        indexes.sort()
                    for chunk in self._tail:
                        found.setdefault(chunk.partition, []).extend(range(chunk.first, chunk.first + chunk.count))
                    self._partitions = found
        return self._partitions

    async def take(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None = 0.0,
        sampler: Sampler | None = None,
        lease: tuple[float, Peer | None] | None = None,
        **kw: Any,
    ) -> list[int]:
        """The samples of ``partition`` the sampler picks among those ``task`` has not taken (default: the next
        ``batch_size`` in index order).

        Consume-on-fetch (``lease`` None): each sample goes to the task once; the take is logged first.
        Acknowledged delivery (``lease`` = (seconds, holder process or None)): the samples are leased, and come
        back to the task when the lease ends or its holder dies, unless ``mark_consumed`` came first
        (at-least-once; leases are not kept across a restart, so a restart hands them out again).

        ``timeout``: wait (notified by puts, not polling) up to this many seconds (None: for ever) until the
        sampler fills a batch; then hand out what it picks, maybe fewer or none."""
        self._check_open()
        sampler = sampler if sampler is not None else SequentialSampler()
        cache_key = getattr(sampler, "cache_key", None)
        key = cache_key(**kw) if cache_key is not None else None
        if key is not None and (partition, task, *key) in self._rank_cache:
            return list(self._rank_cache[(partition, task, *key)])  # another rank of this group asked first
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        state = self._consumption.setdefault((partition, task), Consumption())
        while True:
            indexes = (await self._partition_index()).get(partition, [])
            end = bisect.bisect_left(indexes, self.visible_upto, lo=state.floor)
            next_expiry = state.expire(loop.time()) if state.leased else None
            taken = state.done if not state.leased else state.done | state.leased.keys()
            positions = [p for p in range(state.floor, end) if indexes[p] not in taken]
            ready = [indexes[p] for p in positions]
            extra: dict[str, Any] = {}
            length_field = getattr(sampler, "length_field", None)
            if isinstance(length_field, str):
                front = ready[: sampler.window(batch_size)]  # type: ignore[attr-defined]
                extra["lengths"] = await self._field_values(front, length_field)
            result = sampler.sample(ready, batch_size, positions=positions, **extra, **kw)
            sampled, consumed = result[0], result[1]
            shares: dict[tuple[Any, ...], list[int]] = result[2] if len(result) > 2 else {}
            left = None if deadline is None else deadline - loop.time()
            if len(sampled) >= batch_size or (left is not None and left <= 0):
                break
            if next_expiry is not None:  # a lease that ends makes samples ready without a put
                until_expiry = max(0.0, next_expiry - loop.time())
                left = until_expiry if left is None else min(left, until_expiry)
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
            self._check_open()
        allowed = set(ready)
        if not allowed.issuperset(sampled) or not allowed.issuperset(consumed):
            raise ConfigError(
                f"sampler {type(sampler).__qualname__} returned samples that were not ready for task {task!r}"
            )
        if lease is not None:
            until = loop.time() + lease[0]
            for index in consumed:
                state.leased[index] = (until, lease[1])
        elif consumed:
            if self._consumption_log is not None:
                # Written before the answer leaves: a kill -9 after this never hands these samples out again.
                self._consumption_log.append(["take", partition, task, list(consumed)])
            state.done.update(consumed)
        while state.floor < len(indexes) and indexes[state.floor] in state.done:
            state.floor += 1
        for other_key, share in shares.items():  # the other ranks' parts of this step
            self._rank_cache[(partition, task, *other_key)] = list(share)
        if key is not None:
            self._rank_cache[(partition, task, *key)] = list(sampled)
            if len(self._rank_cache) > RANK_CACHE_SIZE:
                self._rank_cache.popitem(last=False)
        return list(sampled)

    async def _field_values(self, indexes: list[int], name: str) -> dict[int, Any]:
        """One plain field's values for samples (arena batches: from memory; others: their rows)."""
        out: dict[int, Any] = {}
        need: list[int] = []
        for index in indexes:
            chunk = self.arena_chunk(index)
            if chunk is not None:
                out[index] = chunk.other[index - chunk.first].get(name)
            else:
                need.append(index)
        if need:
            rows, _kinds = await self.rows_at(need)
            out.update((i, row.get(name)) for i, row in zip(need, rows, strict=True))
        return out

    async def mark_consumed(self, partition: str, task: str, indexes: list[int]) -> None:
        """Acknowledge samples for ``task``: they are never handed to it again (logged like a take)."""
        self._check_open()
        known = set((await self._partition_index()).get(partition, []))
        unknown = [i for i in indexes if i not in known or i >= self.visible_upto]
        if unknown:
            raise ConfigError(f"partition {partition!r} has no samples with global indexes {unknown[:10]}")
        state = self._consumption.setdefault((partition, task), Consumption())
        if self._consumption_log is not None and indexes:
            self._consumption_log.append(["take", partition, task, list(indexes)])
        state.done.update(indexes)
        for index in indexes:
            state.leased.pop(index, None)

    def reset_consumption(self, partition: str, task: str) -> None:
        """Every sample of ``partition`` becomes available to ``task`` again (logged: it survives a restart)."""
        self._check_open()
        if self._consumption_log is not None:
            self._consumption_log.append(["reset", partition, task])
        self._consumption.pop((partition, task), None)
        for key in [k for k in self._rank_cache if k[:2] == (partition, task)]:
            del self._rank_cache[key]

    def tail_chunk(self, index: int) -> Chunk | None:
        if index < self.flushed_upto or index >= self.visible_upto:
            return None
        k = bisect.bisect_right(self._tail_firsts, index) - 1
        if k < 0:
            return None
        chunk = self._tail[k]
        return chunk if chunk.first <= index < chunk.first + chunk.count else None

    def arena_chunk(self, index: int) -> Chunk | None:
        """The arena batch holding ``index``: in the tail, or flushed and still resident in the arena."""
        chunk = self.tail_chunk(index)
        if chunk is None and index < self.flushed_upto:
            k = bisect.bisect_right(self._resident_firsts, index) - 1
            if k >= 0:
                found = self._resident[k]
                if found.first <= index < found.first + found.count:
                    chunk = found
        return chunk if chunk is not None and chunk.arena is not None else None

    def forget_arena(self, extent_id: int) -> None:
        """The arena reuses this extent: its (flushed) samples are read from the backends from now on."""
        for k, chunk in enumerate(self._resident):
            if chunk.arena is not None and chunk.arena.extent_id == extent_id:
                del self._resident[k]
                del self._resident_firsts[k]
                return

    def arena_runs(self, indexes: list[int], fields: list[str]) -> list[tuple[int, list[list[Any]]]] | None:
        """Where the tensor fields of ``indexes`` lie in the arena, if all of them do (else None).

        One entry per run of consecutive samples in one extent: (extent id, [[field, kind, dtype, shape,
        offset of the run's first sample, samples in the run, bytes per sample], ...]). Nothing awaits here, so
        the answer stays true until the caller's next await (a hold taken before it keeps it true after).
        """
        runs: list[tuple[int, list[list[Any]]]] = []
        for chunk, at, count in self._arena_groups(indexes):
            if chunk is None or chunk.arena is None:
                return None
            i = indexes[at] - chunk.first
            entry_fields: list[list[Any]] = []
            for name in fields:
                col = chunk.arena.columns.get(name)
                if col is None:
                    return None
                per = col.array.strides[0] if col.array.ndim else 0
                addr = col.array.__array_interface__["data"][0] + i * per
                entry_fields.append([name, col.kind, col.dtype_name, list(col.sample_shape), addr, count, per])
            runs.append((chunk.arena.extent_id, entry_fields))
        return runs

    def _arena_groups(self, indexes: list[int]) -> list[tuple[Chunk | None, int, int]]:
        """``indexes`` cut into runs of consecutive indexes inside one arena batch: (batch or None, position in
        ``indexes``, length). One lookup per run, not per sample (a meta is usually one or a few batches)."""
        out: list[tuple[Chunk | None, int, int]] = []
        k, total = 0, len(indexes)
        while k < total:
            chunk = self.arena_chunk(indexes[k])
            if chunk is None:
                out.append((None, k, 1))
                k += 1
                continue
            end = chunk.first + chunk.count
            j = k + 1
            while j < total and indexes[j] == indexes[j - 1] + 1 and indexes[j] < end:
                j += 1
            out.append((chunk, k, j - k))
            k = j
        return out

    async def rows_at(self, indexes: list[int]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Rows of arbitrary (sorted or not) indexes, in the order given; reads contiguous runs at once."""
        out: dict[int, dict[str, Any]] = {}
        kinds = dict(self.kinds)
        ordered = sorted(set(indexes))
        k = 0
        while k < len(ordered):
            j = k
            while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
                j += 1
            rows, kinds = await self.read(ordered[k], j - k + 1)
            for n, row in enumerate(rows):
                out[ordered[k] + n] = row
            k = j + 1
        missing = [i for i in indexes if i not in out]
        if missing:
            raise ConfigError(f"topic {self.name!r} has no samples at global indexes {missing[:10]}")
        return [out[i] for i in indexes], kinds

    async def describe(self, indexes: list[int]) -> list[list[Any]]:
        """Field descriptions of ``indexes``, run-length encoded: ``[[count, {field: [kind, dtype, shape]}], ...]``
        (dtype and per-sample shape for tensor fields, "" and [] for others). Samples of one batch share a run,
        so a meta of hundreds of samples costs one description per batch, not one per sample."""
        descs: list[dict[str, list[Any]] | None] = [None] * len(indexes)
        need: list[int] = []
        for chunk, at, count in self._arena_groups(indexes):
            if chunk is None or chunk.arena is None:
                need.extend(range(at, at + count))
                continue
            base = {
                name: [col.kind, col.dtype_name, list(col.sample_shape)] for name, col in chunk.arena.columns.items()
            }
            first = indexes[at] - chunk.first
            for n, other in enumerate(chunk.other[first : first + count], start=at):
                if other:
                    desc = dict(base)
                    desc.update({k: [self.kinds.get(k, ""), "", []] for k, v in other.items() if v is not None})
                    descs[n] = desc
                else:
                    descs[n] = base
        if need:
            rows, kinds = await self.rows_at([indexes[n] for n in need])
            for n, row in zip(need, rows, strict=True):
                found: dict[str, list[Any]] = {}
                for name, value in row.items():
                    if name.startswith(RESERVED_PREFIX) or value is None:
                        continue
                    kind = kinds.get(name, "")
                    if kind in ("ndarray", "tensor"):
                        dtype_name, arr = decode_sample(kind, value)
                        found[name] = [kind, dtype_name, list(arr.shape)]
                    else:
                        found[name] = [kind, "", []]
                descs[n] = found
        runs: list[list[Any]] = []
        for entry in descs:
            if runs and (runs[-1][1] is entry or runs[-1][1] == entry):
                runs[-1][0] += 1
            else:
                runs.append([1, entry or {}])
        return runs
