"""Samples of a topic: partitions, consume-on-fetch, and where tensor fields lie (for get_meta/get_data).

A mixin of ``engine.Topic``, kept apart so that the engine module stays about storage. The state it reads is
the Topic's (declared below for the type checker); like the rest of the engine, it runs on the engine's loop.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .arena import Peer, peer_alive
from .codec import RESERVED_PREFIX, decode_sample
from .consumption import ConsumptionLog
from .errors import ConfigError
from .fields import FieldIndex
from .layout import FIELDS_KEY, INDEX_KEY, OF_KEY, PARTITION_KEY
from .queue.backend import StorageBackend
from .samplers import RANK_CACHE_SIZE, Sampler, SequentialSampler, Shares
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
    _cleared: set[int]
    _tags: dict[int, dict[str, Any]]
    _fields: FieldIndex
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

        def _index_chunk(self, chunk: Chunk) -> None: ...

        def check_not_cleared(self, indexes: list[int]) -> None: ...

        async def check_in_partition(self, partition: str, indexes: Sequence[int], why: str = "") -> None: ...

        async def read(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str]]: ...

        @staticmethod
        async def _read_column(backend: StorageBackend, key: str) -> list[Any]: ...

    async def _partition_index(self) -> dict[str, list[int]]:
        if self._partitions is None:
            # Under the flush lock, the backends and the tail hold disjoint rows and none moves between them.
            async with self._flush_lock:
                if self._partitions is None:
                    fields = FieldIndex()
                    found: dict[str, list[tuple[int, int]]] = {}
                    patches: list[tuple[int, int, int]] = []  # (patch row, sample it writes, field set id)
                    for backend in self._backends:
                        parts = await self._read_column(backend, PARTITION_KEY)
                        indexes = await self._read_column(backend, INDEX_KEY)
                        targets = await self._read_column(backend, OF_KEY)
                        names = await self._read_column(backend, FIELDS_KEY)
                        for partition, index, of, raw in zip(parts, indexes, targets, names, strict=True):
                            if of is None:
                                found.setdefault(str(partition), []).append((int(index), fields.intern_json(raw)))
                            else:
                                patches.append((int(index), int(of), fields.intern_json(raw)))
                    partitions: dict[str, list[int]] = {}
                    for partition, pairs in found.items():
                        pairs.sort()
                        partitions[partition] = [index for index, _ in pairs]
                        fields.add(partition, [set_id for _, set_id in pairs])
                    for index, of, set_id in sorted(patches):
                        fields.patch(index, [of], sorted(fields.sets[set_id]))
                    self._fields = fields
                    self._partitions = partitions
                    for chunk in self._tail:
                        self._index_chunk(chunk)
        return self._partitions

    async def field_index(self) -> FieldIndex:
        """Own fields and patches of every sample (built with the partition index on first use)."""
        await self._partition_index()
        return self._fields

    async def take(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None = 0.0,
        sampler: Sampler | None = None,
        lease: tuple[float, Peer | None] | None = None,
        fields: list[str] | None = None,
        **kw: Any,
    ) -> list[int]:
        """The samples of ``partition`` the sampler picks among those ``task`` has not taken (default: the next
        ``batch_size`` in index order).

        Consume-on-fetch (``lease`` None): each sample goes to the task once; the take is logged first.
        Acknowledged delivery (``lease`` = (seconds, holder process or None)): the samples are leased, and come
        back to the task when the lease ends or its holder dies, unless ``mark_consumed`` came first
        (at-least-once; leases are not kept across a restart, so a restart hands them out again).

        ``timeout``: wait (notified by puts, not polling) up to this many seconds (None: for ever) until the
        sampler fills a batch; then hand out what it picks, maybe fewer or none.

        ``fields``: only samples whose every one of these fields is produced count as ready (fields.py)."""
        self._check_open()
        sampler = sampler if sampler is not None else SequentialSampler()
        cache_key = getattr(sampler, "cache_key", None)
        key = cache_key(**kw) if cache_key is not None else None
        if key is not None and (partition, task, *key) in self._rank_cache:
            return list(self._rank_cache[(partition, task, *key)])  # another rank of this group asked first
        window = self._window(sampler, batch_size)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        state = self._consumption.setdefault((partition, task), Consumption())
        while True:
            indexes = (await self._partition_index()).get(partition, [])
            end = bisect.bisect_left(indexes, self.visible_upto, lo=state.floor)
            next_expiry = state.expire(loop.time()) if state.leased else None
            skip = self._unready(partition, indexes, fields)
            ready, positions, truncated = self._ready_front(state, indexes, end, window, skip)
            result = await self._sample(sampler, ready, positions, batch_size, kw)
            if truncated and len(result[0]) < batch_size:
                # The front did not make a batch (say, its groups are not whole yet): ask again with every ready
                # sample, so the answer is the one the whole list gives. Costs what a take cost before windows.
                ready, positions, _ = self._ready_front(state, indexes, end, None, skip)
                result = await self._sample(sampler, ready, positions, batch_size, kw)
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
        allowed = set(ready)  # what the sampler was shown: the window, unless it had to see everything
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
                # Written before the answer leaves: a kill -9 after this never hands these samples out again, and
                # the other ranks of this step still get their part of it (the answers ride in the same frame).
                record: list[Any] = ["take", partition, task, list(consumed)]
                answers = _durable_answers(key, sampled, shares)
                if answers:
                    record.append(answers)
                self._consumption_log.append(record)
            state.done.update(consumed)
        cleared = self._cleared
        while state.floor < len(indexes) and (indexes[state.floor] in state.done or indexes[state.floor] in cleared):
            state.floor += 1
        for other_key, share in shares.items():  # the other ranks' parts of this step
            self._rank_cache[(partition, task, *other_key)] = list(share)
        if key is not None:
            self._rank_cache[(partition, task, *key)] = list(sampled)
        while len(self._rank_cache) > RANK_CACHE_SIZE:  # a step's shares can add several entries at once
            self._rank_cache.popitem(last=False)
        return list(sampled)

    @staticmethod
    def _window(sampler: Sampler, batch_size: int) -> int | None:
        """How many ready samples from the front ``sampler`` asks to see (None: it declares no window, sees all)."""
        window = getattr(sampler, "window", None)
        if window is None:
            return None
        limit = window(batch_size)
        if type(limit) is not int or limit < 0:
            raise ConfigError(
                f"sampler {type(sampler).__qualname__}.window({batch_size}) must be an int >= 0, got {limit!r}"
            )
        return limit

    def _unready(self, partition: str, indexes: list[int], fields: list[str] | None) -> Callable[[int], bool] | None:
        """A test of a position of ``partition`` (in ``indexes``): True when the sample was cleared or one of
        ``fields`` is not produced for it."""
        cleared = self._cleared
        if not fields:
            return (lambda p: indexes[p] in cleared) if cleared else None
        need = frozenset(fields)
        ready = self._fields.ready
        return lambda p: indexes[p] in cleared or not ready(partition, p, indexes[p], need)

    @staticmethod
    def _ready_front(
        state: Consumption,
        indexes: list[int],
        end: int,
        limit: int | None,
        skip: Callable[[int], bool] | None = None,
    ) -> tuple[list[int], list[int], bool]:
        """The first ``limit`` (None: all) samples the task may take among ``indexes[state.floor:end]``: (global
        indexes, their positions in the partition, whether more were ready after them).

        A sample is ready unless the task took it, holds a lease on it, or ``skip(position)`` says so. The scan stops
        at the first ready sample past ``limit``, so it costs the window plus the taken or leased samples above the
        floor, not the backlog."""
        done, leased = state.done, state.leased
        ready: list[int] = []
        positions: list[int] = []
        for p in range(state.floor, end):
            index = indexes[p]
            if index in done or index in leased or (skip is not None and skip(p)):
                continue
            if limit is not None and len(ready) >= limit:
                return ready, positions, True
            ready.append(index)
            positions.append(p)
        return ready, positions, False

    async def _sample(
        self, sampler: Sampler, ready: list[int], positions: list[int], batch_size: int, kw: dict[str, Any]
    ) -> tuple[list[int], list[int]] | tuple[list[int], list[int], Shares]:
        """One call of the sampler; a sampler with a ``length_field`` gets the lengths of the samples it deals."""
        length_field = getattr(sampler, "length_field", None)
        if not isinstance(length_field, str):
            return sampler.sample(ready, batch_size, positions=positions, **kw)
        front = ready[: self._window(sampler, batch_size)]
        lengths = await self._field_values(front, length_field)
        result = sampler.sample(ready, batch_size, positions=positions, lengths=lengths, **kw)
        missing = [i for i in result[1] if i not in lengths]
        if missing:  # it dealt samples past the front (groups there were not whole): deal again with their lengths
            lengths.update(await self._field_values(missing, length_field))
            result = sampler.sample(ready, batch_size, positions=positions, lengths=lengths, **kw)
        return result

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
        await self.check_in_partition(partition, indexes)
        self.check_not_cleared(indexes)
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
        sources = self._fields.sources
        if sources and any(i in sources for i in indexes):
            # Some fields were written later by patches: each field's runs follow the rows that hold it.
            runs = []
            for name in fields:
                part = self._arena_field_runs([self._fields.source(i, name) for i in indexes], [name])
                if part is None:
                    return None
                runs.extend(part)
            return runs
        return self._arena_field_runs(indexes, fields)

    def _arena_field_runs(self, indexes: list[int], fields: list[str]) -> list[tuple[int, list[list[Any]]]] | None:
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
        self.check_not_cleared(indexes)
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
        """Field descriptions of ``indexes``, run-length encoded: ``[[count, {field: [kind, dtype, shape]}
        [, tags]], ...]`` (dtype and per-sample shape for tensor fields, "" and [] for others; ``tags``: the
        samples' stored tags, absent when they have none). Samples of one batch share a run, so a meta of
        hundreds of samples costs one description per batch, not one per sample. Fields written later by patches
        are described from the rows that hold them."""
        descs = await self._describe_each(indexes)
        sources = (await self.field_index()).sources
        patched = [(n, sources[i]) for n, i in enumerate(indexes) if i in sources]
        if patched:
            rows = sorted({src for _, written in patched for src in written.values()})
            found = dict(zip(rows, await self._describe_each(rows), strict=True))
            for n, written in patched:
                desc = dict(descs[n] or {})
                for name, src in written.items():
                    held = (found[src] or {}).get(name)
                    if held is not None:
                        desc[name] = held
                descs[n] = desc
        runs: list[list[Any]] = []
        tags = self._tags
        for index, entry in zip(indexes, descs, strict=True):
            tagged = tags.get(index) if tags else None
            if runs and (runs[-1][1] is entry or runs[-1][1] == entry) and (runs[-1][2:] or [None])[0] == tagged:
                runs[-1][0] += 1
            else:
                runs.append([1, entry or {}] if tagged is None else [1, entry or {}, tagged])
        return runs

    async def _describe_each(self, indexes: list[int]) -> list[dict[str, list[Any]] | None]:
        """Each row's own field descriptions (samples of one arena batch share one dict)."""
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
        return descs

    async def plain_values(self, indexes: list[int], names: list[str]) -> list[dict[str, Any]]:
        """Stored values of non-tensor fields of samples, read beside the arena views without encoding any
        payload: from the arena batches' own rows where they lie there, else from the rows that hold them."""
        keep = set(names)
        out: list[dict[str, Any]] = []
        later: list[tuple[int, str, int]] = []  # (position, field, row holding it) to read from storage
        sources = self._fields.sources
        for n, index in enumerate(indexes):
            chunk = self.arena_chunk(index)
            if chunk is None:
                out.append({})
                later.extend((n, name, self._fields.source(index, name)) for name in names)
                continue
            out.append({k: v for k, v in chunk.other[index - chunk.first].items() if k in keep})
            for name, src in sources.get(index, {}).items():
                if name not in keep:
                    continue
                holder = self.arena_chunk(src)
                if holder is not None:
                    out[n][name] = holder.other[src - holder.first].get(name)
                else:
                    later.append((n, name, src))
        if later:
            need = sorted({src for _, _, src in later})
            rows, _kinds = await self.rows_at(need)
            by_index = dict(zip(need, rows, strict=True))
            for n, name, src in later:
                value = by_index[src].get(name)
                if value is None:
                    out[n].pop(name, None)
                else:
                    out[n][name] = value
        return out

    async def sample_rows(self, indexes: list[int], fields: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The stored values of ``fields`` of samples, each field from the latest row that wrote it (the sample
        itself, or a patch), in the order given."""
        rows, kinds = await self.rows_at(indexes)
        sources = (await self.field_index()).sources
        keep = set(fields)
        out = [{k: v for k, v in row.items() if k in keep} for row in rows]
        wanted = [
            (n, name, src) for n, i in enumerate(indexes) for name, src in sources.get(i, {}).items() if name in keep
        ]
        if wanted:
            need = sorted({src for _, _, src in wanted})
            patch_rows, kinds = await self.rows_at(need)
            by_index = dict(zip(need, patch_rows, strict=True))
            for n, name, src in wanted:
                out[n][name] = by_index[src].get(name)
        return out, kinds


def _plain_key(key: tuple[Any, ...]) -> bool:
    return all(type(part) in (int, str, float, bool) for part in key)


def _durable_answers(
    key: tuple[Any, ...] | None, sampled: list[int], shares: dict[tuple[Any, ...], list[int]]
) -> list[list[Any]]:
    """The cache entries a consume-on-fetch take creates, for its log frame: the built-in samplers' keys are
    ints; a custom sampler's key of other types is remembered in memory only."""
    entries = [[list(k), list(v)] for k, v in shares.items() if _plain_key(k)]
    if key is not None and _plain_key(key):
        entries.append([list(key), list(sampled)])
    return entries
