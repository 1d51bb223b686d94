"""Handing samples to tasks: consume-on-fetch, leases, samplers, and what each task has taken.

``Takes`` is composed into ``topic.Topic`` and runs on the engine's loop. A take asks the sampler for samples of
one partition that the task has not taken, leased or seen cleared, and whose asked-for fields are produced
(``SampleIndex``); it logs the take in the consumption log before answering (consume-on-fetch), or leases the
samples (acknowledged delivery). The log is shared with ``Clears`` (clears, tags); each owns its records.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ConfigError
from ..tensors.arena import Peer
from .consumption import TAKE_KEYS_KEPT, Consumption, ConsumptionLog, Taken, remember_answers
from .index import SampleIndex
from .partitions import Clears
from .reader import Reader
from .runs import PartitionIndex, Spans, runs_of, without
from .samplers import Sampler, SequentialSampler, Shares
from .tail import Tail

# Drops the positions of spans whose samples may not be handed out; ``offset`` turns a position into its global
# index (global = position + offset: the spans lie in one run of consecutive indexes).
SpanFilter = Callable[[Spans, int], Spans]
_NO_SAMPLES = PartitionIndex()


class Takes:
    """What each task took from each partition, leases, and the samplers' remembered answers; their one owner."""

    def __init__(
        self,
        log: ConsumptionLog,
        index: SampleIndex,
        tail: Tail,
        clears: Clears,
        reader: Reader,
        check_open: Callable[[], None],
    ) -> None:
        self._log = log
        self._check_open = check_open  # a take waiting for samples ends when the topic closes
        self._index = index
        self._tail = tail
        self._clears = clears
        self._reader = reader
        self._consumption: dict[tuple[str, str], Consumption] = {}  # (partition, task) -> what it has taken
        self._rank_cache: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._take_keys: OrderedDict[str, list[int]] = OrderedDict()  # a take's request key -> its batch

    def load(self, taken: Taken) -> None:
        """At open: what the consumption log holds (``taken``: what its ``open`` replayed)."""
        self._consumption = {key: Consumption(done) for key, done in taken.items()}
        self._rank_cache = OrderedDict(self._log.answers)
        self._take_keys = OrderedDict(self._log.keys)

    def states(self, partition: str) -> Iterator[tuple[str, Consumption]]:
        """(task, what it took) for each task that took from ``partition``."""
        for (where, task), state in self._consumption.items():
            if where == partition:
                yield task, state

    def listing(self, index: dict[str, PartitionIndex]) -> dict[str, dict[str, Any]]:
        """Per partition: samples (not cleared), cleared, and per task how many it has taken (and holds leased).
        A partition whose samples were all cleared and purged stays listed (no samples) while the consumption log
        remembers it, as it does before the purge."""
        # A take of a partition that has no samples (a read) leaves an empty state: not a partition to list.
        used = (p for (p, _task), state in self._consumption.items() if len(state.done) or len(state.leased))
        names = dict.fromkeys([*index, *self._clears.partitions(), *used])
        out: dict[str, dict[str, Any]] = {}
        for partition in names:
            samples = index.get(partition, _NO_SAMPLES)
            left, cleared = self._clears.counts(partition, samples)
            gone = self._clears.cleared_in(partition) or set()
            tasks: dict[str, dict[str, int]] = {}
            for task, state in self.states(partition):
                taken = len(state.done) - sum(1 for i in gone if i in state.done)
                tasks[task] = {"consumed": taken, "leased": len(state.leased)}
            out[partition] = {"samples": left, "cleared": cleared, "tasks": tasks}
        return out

    def release(self, partition: str, indexes: list[int]) -> None:
        """Leases on these samples end (they were cleared)."""
        for _task, state in self.states(partition):
            if state.leased:
                state.leased.release(indexes)

    async def take(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None = 0.0,
        sampler: Sampler | None = None,
        lease: tuple[float, Peer | None] | None = None,
        fields: list[str] | None = None,
        request_key: str | None = None,
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

        ``fields``: only samples whose every one of these fields is produced count as ready (fields.py).

        ``request_key``: the client's key for this take (broker mode). A take whose key was answered already,
        before a restart too (it rides in the take's log frame), gets the same batch again: the first answer
        may have been lost with a broker that died."""
        if request_key is not None and request_key in self._take_keys:
            return list(self._take_keys[request_key])
        sampler = sampler if sampler is not None else SequentialSampler()
        cache_key = getattr(sampler, "cache_key", None)
        key = cache_key(**kw) if cache_key is not None else None
        if key is not None and (partition, task, *key) in self._rank_cache:
            return list(self._rank_cache[(partition, task, *key)])  # another rank of this group asked first
        window = self._window(sampler, batch_size)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        state = self._consumption.get((partition, task))
        if state is None:
            state = self._consumption[(partition, task)] = Consumption()
        while True:
            built = await self._index.partitions()
            indexes = built.get(partition, _NO_SAMPLES)
            end = max(state.floor, indexes.below(self._tail.visible_upto))
            next_expiry = state.expire(loop.time()) if state.leased else None
            skip = self._unready(partition, fields)
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
            await self._tail.changed(left)
            self._check_open()
        # What the sampler was shown (the window, unless it had to see everything) is ascending: look each pick up
        # there instead of building a set of a whole backlog per take.
        if not _within(ready, sampled) or (consumed is not sampled and not _within(ready, consumed)):
            raise ConfigError(
                f"sampler {type(sampler).__qualname__} returned samples that were not ready for task {task!r}"
            )
        if lease is not None:
            state.leased.lease(consumed, loop.time() + lease[0], lease[1])
        elif consumed:
            taken = runs_of(consumed)
            # Written before the answer leaves: a kill -9 after this never hands these samples out again, and
            # the other ranks of this step still get their part of it (the answers ride in the same frame).
            record: list[Any] = ["took", partition, task, taken]
            answers = _durable_answers(key, sampled, shares)
            if answers or request_key is not None:
                record.append(answers)
            if request_key is not None:
                record.append([request_key, taken if sampled is consumed else runs_of(sampled)])
            self._log.append(record)
            state.done.add_runs(taken)
            if request_key is not None:  # a new key (one answered already returned above): newest at the end
                self._take_keys[request_key] = list(sampled)
                if len(self._take_keys) > TAKE_KEYS_KEPT:
                    self._take_keys.popitem(last=False)
        state.advance_floor(indexes, self._clears.cleared_in(partition))
        parts: list[tuple[tuple[Any, ...], list[int]]] = list(shares.items())  # the other ranks' parts of this step
        if key is not None:
            parts.append((key, sampled))
        remember_answers(self._rank_cache, partition, task, parts)
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

    def _unready(self, partition: str, fields: list[str] | None) -> SpanFilter | None:
        """The filter of a take's candidates in ``partition``: drops the samples that were cleared, and (given
        ``fields``) those lacking one of them (None: nothing to drop)."""
        cleared = self._clears.cleared_in(partition)
        need = frozenset(fields or ())
        if not need or self._index.fields.covers(partition, need):  # every sample was put with these fields
            return (lambda spans, offset: without(spans, offset, cleared)) if cleared else None
        ready_spans = self._index.fields.ready_spans

        def keep(spans: Spans, offset: int) -> Spans:
            if cleared:
                spans = without(spans, offset, cleared)
            out: Spans = []
            for a, b in spans:
                out.extend(ready_spans(partition, a, b, a + offset, need))
            return out

        return keep

    @staticmethod
    def _ready_front(
        state: Consumption,
        indexes: PartitionIndex,
        end: int,
        limit: int | None,
        skip: SpanFilter | None = None,
    ) -> tuple[list[int], list[int], bool]:
        """The first ``limit`` (None: all) samples the task may take among positions ``[state.floor, end)`` of
        the partition: (global indexes, their positions in the partition, whether more were ready after them).

        A sample is ready unless the task took it, holds a lease on it, or ``skip`` drops it. The scan goes by
        runs: of the partition's consecutive indexes, minus the intervals the task took; it looks at no more of a
        run than the batch still needs (plus one sample, to tell whether more were ready), so it costs the window
        plus a step per taken interval and per run above the floor, not the backlog."""
        done, held = state.done, state.leased.held
        ready: list[int] = []
        positions: list[int] = []
        for first, start, count in indexes.runs(state.floor, end):
            offset = first - start  # global index - position, along this run
            g, run_end = first, first + count
            while g < run_end:
                while True:  # past the intervals the task took or holds leased, which may follow each other
                    g, following = done.gap(g)
                    if not held:
                        break
                    past_held, following_held = held.gap(g)
                    if past_held == g:
                        if following is None or (following_held is not None and following_held < following):
                            following = following_held
                        break
                    g = past_held
                if g >= run_end:
                    break
                free_end = run_end if following is None or following > run_end else following
                while g < free_end:
                    want = free_end - g if limit is None else min(free_end - g, limit - len(ready) + 1)
                    spans: Spans = [[g - offset, g + want - offset]]
                    if skip is not None:
                        spans = skip(spans, offset)
                    for a, b in spans:
                        if limit is not None and len(ready) + b - a > limit:
                            b = a + limit - len(ready)
                            ready.extend(range(a + offset, b + offset))
                            positions.extend(range(a, b))
                            return ready, positions, True
                        ready.extend(range(a + offset, b + offset))
                        positions.extend(range(a, b))
                    g += want
        return ready, positions, False

    async def _sample(
        self, sampler: Sampler, ready: list[int], positions: list[int], batch_size: int, kw: dict[str, Any]
    ) -> tuple[list[int], list[int]] | tuple[list[int], list[int], Shares]:
        """One call of the sampler; a sampler with a ``length_field`` gets the lengths of the samples it deals."""
        length_field = getattr(sampler, "length_field", None)
        if not isinstance(length_field, str):
            return sampler.sample(ready, batch_size, positions=positions, **kw)
        front = ready[: self._window(sampler, batch_size)]
        lengths = await self._reader.field_values(front, length_field)
        result = sampler.sample(ready, batch_size, positions=positions, lengths=lengths, **kw)
        missing = [i for i in result[1] if i not in lengths]
        if missing:  # it dealt samples past the front (groups there were not whole): deal again with their lengths
            lengths.update(await self._reader.field_values(missing, length_field))
            result = sampler.sample(ready, batch_size, positions=positions, lengths=lengths, **kw)
        return result

    async def mark_consumed(self, partition: str, task: str, indexes: list[int]) -> None:
        """Acknowledge samples for ``task``: they are never handed to it again (logged like a take)."""
        await self._clears.check_in_partition(partition, indexes)
        self._clears.check_not_cleared(indexes)
        state = self._consumption.get((partition, task))
        if state is None:
            state = self._consumption[(partition, task)] = Consumption()
        if indexes:
            self._log.append(["took", partition, task, runs_of(indexes)])
        state.done.update(indexes)
        if state.leased:
            state.leased.release(indexes)

    def give_back(self, partition: str, task: str, indexes: list[int]) -> None:
        """End the task's leases on these samples without consuming them: they are ready for the task again (a
        negative acknowledgement; like any lease, not logged). Samples not leased are left as they are. Wakes
        waiting takes."""
        state = self._consumption.get((partition, task))
        if state is None or not state.leased:
            return
        state.leased.release(indexes)
        self._tail.wake()

    def reset_consumption(self, partition: str, task: str) -> None:
        """Every sample of ``partition`` becomes available to ``task`` again (logged: it survives a restart)."""
        self._log.append(["reset", partition, task])
        self._consumption.pop((partition, task), None)
        for key in [k for k in self._rank_cache if k[:2] == (partition, task)]:
            del self._rank_cache[key]


def _within(ascending: list[int], picked: list[int]) -> bool:
    """Whether every index of ``picked`` is in ``ascending`` (sorted, no repeats)."""
    k, n = 0, len(ascending)
    for i in picked:
        if k < n and ascending[k] == i:  # the usual pick: the next of what was shown, no search
            k += 1
            continue
        k = bisect.bisect_left(ascending, i)
        if k == n or ascending[k] != i:
            return False
        k += 1
    return True


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
