"""Samplers: which of the ready samples a ``get_meta`` call hands out.

The protocol (a custom sampler implements it)::

    sample(ready, batch_size, **kw) -> (sampled, consumed)

The engine passes ``ready`` positionally, so a sampler written for TransferQueue, ``sample(self, ready_indexes,
batch_size, *args, **kwargs)``, works unchanged; the built-in ones also take ``ready_indexes=`` by name.
``ready`` lists the global indexes of the samples this task may still take in the partition, in index order;
``kw`` carries ``positions`` (each ready sample's position in its partition: 0 for the first sample ever put
there, counting every sample ever put there, cleared ones included) plus what the caller passed (``dp_rank``,
``batch_index``, ...). ``sampled`` goes into the BatchMeta;
``consumed`` is marked taken for the task (consume-on-fetch), usually the same list; an optional third element
gives other ranks' parts of the same step by cache key (LengthBalancedSampler). A sampler that cannot fill
a whole batch returns what it can: ``get_meta(wait=True)`` waits until it fills one.

Optionally ``window(batch_size) -> int``: how many ready samples from the front the sampler needs to see. The
engine then passes only the first ``window`` ready samples (and their positions), so a call costs the same
whatever the backlog; if the sampler does not fill the batch from them (fewer than ``batch_size`` sampled) and
more samples were ready, it is asked again with the whole list. A sampler declaring a window promises that
whenever it fills a batch from a window, it would have picked the same from the whole list (true of any sampler
that picks greedily from the front, like the built-in ones). Without ``window``, ``ready`` is every sample the
task may still take.

Positions never move. A clear leaves a hole where its samples were, and a purge of their rows, a reopen or a
restart after a kill -9 puts none of the later samples in it (engine/index.py), so every sampler answers the same
with and without a restart between its calls. A partition whose every sample was cleared keeps counting: the next
put's first sample is at the position after the last one ever put. What each built-in sampler reads:
``SequentialSampler``, ``RankAwareSampler`` and ``PickSampler`` the ready global indexes only (never cleared
ones); ``GRPOGroupNSampler`` and ``LengthBalancedSampler`` group by position as well; ``window`` counts ready
samples, not positions. A ready list holds no cleared sample, so a group that lost a sample to a clear is never
whole again, and its other samples are not handed out by the groups' samplers (take them with another task).

Built-in samplers work in embedded and broker mode (the broker rebuilds them from ``to_wire()``); a custom
sampler works in embedded mode only, because nothing from the wire is unpickled.

``RankAwareSampler``: every rank of one data-parallel group asking for the same (partition, task, dp_rank,
batch_index) gets the identical batch; different dp_rank values get disjoint samples. The engine remembers the
answer per key (``cache_key``), so the first rank's request samples and the others read it back.

Direct calls. The engine always passes ``positions``; a call without them is a direct call (code written for
Persisting 0.3.0's or TransferQueue 0.1.11's samplers, ``sampler.sample(ready_indexes, batch_size, ...)``), and
the built-in samplers then behave as TransferQueue 0.1.11's do: ``RankAwareSampler`` and ``GRPOGroupNSampler``
hand the same batch again for the same ``(partition_id, task_name, dp_rank, batch_index)`` (the sampler object
remembers it, whatever ``ready_indexes`` is on the repeated call), give a whole batch or nothing, and GRPO groups
runs of n consecutive ready indexes. Through ``get_meta`` GRPO groups by position in the partition instead (see
``GRPOGroupNSampler``), and the engine, not the sampler, remembers the ranks' answers (durably, and forgetting
them on a clear).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError

RANK_CACHE_SIZE = 4096  # (partition, task, dp_rank, batch_index) answers remembered per topic


Shares = dict[tuple[Any, ...], list[int]]  # cache key (dp_rank, batch_index) -> that rank's part of a step


def accepts_ready_indexes(method: Any) -> Any:
    """Let a built-in ``sample`` be called as TransferQueue's samplers are, ``sample(ready_indexes=...,
    batch_size=...)``, as well as with ``ready`` (positionally, as the engine calls every sampler, or by name): code
    written for TransferQueue's sampler interface (Persisting 0.3.0's tests included) runs unchanged."""

    @functools.wraps(method)
    def sample(self: Any, *args: Any, **kw: Any) -> Any:
        if "ready_indexes" in kw:
            if args or "ready" in kw:
                raise ConfigError("sample() got the ready samples twice (ready and ready_indexes)")
            args = (kw.pop("ready_indexes"),)
        return method(self, *args, **kw)

    return sample


class _DirectAnswers:
    """What a sampler answered to direct calls, by ``(partition_id, task_name, dp_rank, batch_index)``: the same
    key gets the same batch again, whatever is ready by then, so every rank of one data-parallel group calling the
    sampler itself gets the same samples (TransferQueue 0.1.11's samplers keep these in ``_states``). The latest
    ``RANK_CACHE_SIZE`` answers are kept: a trainer looping over batch indexes must not grow it without end."""

    def __init__(self) -> None:
        self._answers: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()

    @staticmethod
    def key(kw: dict[str, Any], rank: tuple[Any, ...]) -> tuple[Any, ...]:
        return (kw.get("partition_id"), kw.get("task_name"), *rank)

    def get(self, key: tuple[Any, ...]) -> tuple[list[int], list[int]] | None:
        found = self._answers.get(key)
        return None if found is None else (list(found), list(found))  # copies: a caller's edit stays its own

    def put(self, key: tuple[Any, ...], picked: list[int]) -> None:
        self._answers[key] = list(picked)
        while len(self._answers) > RANK_CACHE_SIZE:
            self._answers.popitem(last=False)

    def clear(self, partition_id: str) -> None:
        for key in [k for k in self._answers if k[0] == partition_id]:
            del self._answers[key]


@runtime_checkable
class Sampler(Protocol):
    def sample(
        self, ready: Sequence[int], batch_size: int, **kw: Any
    ) -> tuple[list[int], list[int]] | tuple[list[int], list[int], Shares]: ...


class SequentialSampler:
    """The first ``batch_size`` ready samples, in index order."""

    name = "sequential"

    def window(self, batch_size: int) -> int:
        """Ready samples (from the front) the sampler needs to see: the batch itself."""
        return batch_size

    @accepts_ready_indexes
    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        picked = list(ready[:batch_size])
        return picked, picked

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name}

    def cache_key(self, **kw: Any) -> tuple[Any, ...] | None:
        return None


class RankAwareSampler(SequentialSampler):
    """Sequential, and the same batch for every rank asking with the same ``dp_rank`` and ``batch_index``.

    Through ``get_meta(..., dp_rank=, batch_index=)`` the engine remembers each answer. Called directly,
    ``sample(ready_indexes, batch_size, dp_rank=, batch_index=, task_name=, partition_id=)`` (``dp_rank`` and
    ``batch_index`` ints >= 0) as Persisting 0.3.0's and TransferQueue 0.1.11's users call it: the first call for a
    ``(partition_id, task_name, dp_rank, batch_index)`` takes the first ``batch_size`` of ``ready_indexes``, or
    nothing (``[], []``, not remembered) when fewer are ready, and this sampler object hands that batch again to
    every later call with the same four, whatever ``ready_indexes`` is then. ``clear_cache(partition_id)`` forgets
    a partition's answers.
    """

    name = "rank_aware"

    def __init__(self) -> None:
        self._direct = _DirectAnswers()

    @accepts_ready_indexes
    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        if "positions" in kw:  # the engine: it remembers the ranks' answers itself (durably; dropped on a clear)
            return super().sample(ready, batch_size, **kw)
        key = self._direct.key(kw, self.cache_key(**kw))
        found = self._direct.get(key)
        if found is not None:
            return found
        picked = list(ready[:batch_size])
        if len(picked) < batch_size:
            return [], []  # a whole batch or none, and nothing remembered: a later call may find it ready
        self._direct.put(key, picked)
        return picked, list(picked)

    def clear_cache(self, partition_id: str) -> None:
        """Forget the answers of direct calls for ``partition_id`` (TransferQueue's ``BaseSampler.clear_cache``)."""
        self._direct.clear(partition_id)

    def cache_key(self, **kw: Any) -> tuple[Any, ...]:
        dp_rank, batch_index = kw.get("dp_rank"), kw.get("batch_index")
        for label, value in (("dp_rank", dp_rank), ("batch_index", batch_index)):
            if type(value) is not int or value < 0:
                raise ConfigError(f"RankAwareSampler needs {label}= an int >= 0, got {value!r}")
        return (dp_rank, batch_index)


class GRPOGroupNSampler:
    """Whole groups of ``n_samples_per_prompt`` (the n responses of one prompt, put together), never split.

    Through ``get_meta``, a group is ``n`` consecutive samples of the partition: positions ``[k*n, (k+1)*n)``;
    put each prompt's responses in one put, in puts whose sizes are multiples of n. A group is handed out once all
    its samples are ready; ``batch_size`` must be a multiple of n. Positions count cleared samples too, after a
    restart as well (see the module's notes): a clear never shifts the groups after it, and a group with a cleared
    sample is never whole again (never handed out). Grouping by position is right whatever global
    index the partition starts at (its first sample need not be a multiple of n), and never takes the last
    responses of one prompt and the first of the next as a group when the others of those groups are not ready.

    Called directly, ``sample(ready_indexes, batch_size)`` has no positions and groups as Persisting 0.3.0's and
    TransferQueue 0.1.11's users expect: runs of n consecutive indexes of the sorted ``ready_indexes``
    (n=2, ``[0, 1, 3, 4, 6, 7]``, batch 4: ``[0, 1, 3, 4]``), a whole batch or nothing (``[], []``); with
    ``dp_rank=`` (and ``batch_index=``, ``task_name=``, ``partition_id=``) the answer is remembered and given again,
    as ``RankAwareSampler`` does. ``clear_cache(partition_id)`` forgets a partition's answers.
    """

    name = "grpo"

    def __init__(self, n_samples_per_prompt: int) -> None:
        if type(n_samples_per_prompt) is not int or n_samples_per_prompt < 1:
            raise ConfigError(f"n_samples_per_prompt must be an int >= 1, got {n_samples_per_prompt!r}")
        self.n = n_samples_per_prompt
        self._direct = _DirectAnswers()

    def window(self, batch_size: int) -> int:
        """Ready samples (from the front) the sampler needs to see: the batch, plus slack for groups at the front
        that are not whole yet (skipped); one more group so that a batch cut by an unaligned put still fits."""
        return 2 * batch_size + self.n

    @accepts_ready_indexes
    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        if batch_size % self.n:
            raise ConfigError(
                f"batch_size {batch_size} is not a multiple of n_samples_per_prompt={self.n}: a batch holds whole "
                "groups only"
            )
        positions: Sequence[int] | None = kw.get("positions")
        if positions is None:  # a direct call: no positions, group as TransferQueue does
            return self._direct_sample(ready, batch_size, kw)
        picked: list[int] = []
        k = 0
        while k < len(ready) and len(picked) < batch_size:
            start = positions[k]
            if start % self.n == 0 and k + self.n <= len(ready) and positions[k + self.n - 1] == start + self.n - 1:
                picked.extend(ready[k : k + self.n])  # all n of the group are ready (positions are consecutive)
                k += self.n
            else:
                k += 1  # a group that is not whole yet (or was split by a put of the wrong size): skip it
        return picked, picked

    def _direct_sample(self, ready: Sequence[int], batch_size: int, kw: dict[str, Any]) -> tuple[list[int], list[int]]:
        key = None if kw.get("dp_rank") is None else self._direct.key(kw, (kw["dp_rank"], kw.get("batch_index")))
        found = None if key is None else self._direct.get(key)
        if found is not None:
            return found
        ordered = sorted(ready)
        n, k = self.n, 0
        picked: list[int] = []
        while k + n <= len(ordered) and len(picked) < batch_size:
            run = ordered[k : k + n]
            if run == list(range(run[0], run[0] + n)):  # n consecutive indexes: one group
                picked.extend(run)
                k += n
            else:
                k += 1
        if len(picked) < batch_size:
            return [], []
        if key is not None:
            self._direct.put(key, picked)
        return picked, list(picked)

    def clear_cache(self, partition_id: str) -> None:
        """Forget the answers of direct calls for ``partition_id`` (TransferQueue's ``BaseSampler.clear_cache``)."""
        self._direct.clear(partition_id)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "n": self.n}

    def cache_key(self, **kw: Any) -> tuple[Any, ...] | None:
        return None


class LengthBalancedSampler:
    """Whole groups split across the ``dp_size`` ranks of one step so that each rank's sum of ``length_field``
    is as even as possible (the trainer's ranks then finish their step at about the same time).

    The first rank asking for a ``batch_index`` takes ``batch_size * dp_size`` samples (whole groups of
    ``n_samples_per_prompt``), deals the groups out (longest first, each to the rank with the smallest sum that
    still has room) and every rank of that step gets its share; ``batch_size`` is per rank and must be a multiple
    of n. ``length_field`` must be an int field of the samples (missing counts as 0).
    """

    name = "length_balanced"

    def __init__(self, length_field: str, dp_size: int, n_samples_per_prompt: int = 1) -> None:
        if not isinstance(length_field, str) or not length_field:
            raise ConfigError("length_field must name an int field of the samples")
        if type(dp_size) is not int or dp_size < 1:
            raise ConfigError(f"dp_size must be an int >= 1, got {dp_size!r}")
        self.length_field = length_field
        self.dp_size = dp_size
        self.groups = GRPOGroupNSampler(n_samples_per_prompt)

    def window(self, batch_size: int) -> int:
        """Ready samples (from the front) the sampler needs to see, and the ones it is given lengths for: a step
        of ``batch_size * dp_size``, with as much again as slack for groups that are not whole yet."""
        return 2 * batch_size * self.dp_size

    def cache_key(self, **kw: Any) -> tuple[Any, ...] | None:
        key = RankAwareSampler().cache_key(**kw)
        if key is not None and key[0] >= self.dp_size:
            raise ConfigError(f"dp_rank {key[0]} is not below dp_size={self.dp_size}")
        return key

    @accepts_ready_indexes
    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int], Shares]:
        n = self.groups.n
        # grouped by position (a direct call: by index), never by the groups sampler's own direct-call rules
        picked, _ = self.groups.sample(ready, batch_size * self.dp_size, positions=kw.get("positions", ready))
        if len(picked) < batch_size * self.dp_size:
            return [], [], {}  # a step is dealt out whole or not at all
        lengths: dict[int, int] = kw.get("lengths") or {}
        groups = [picked[k : k + n] for k in range(0, len(picked), n)]
        groups.sort(key=lambda g: -sum(int(lengths.get(i) or 0) for i in g))
        shares: list[list[int]] = [[] for _ in range(self.dp_size)]
        sums = [0] * self.dp_size
        for group in groups:
            open_ranks = [r for r in range(self.dp_size) if len(shares[r]) < batch_size]
            r = min(open_ranks, key=lambda r: sums[r])
            shares[r].extend(group)
            sums[r] += sum(int(lengths.get(i) or 0) for i in group)
        dp_rank, batch_index = kw["dp_rank"], kw["batch_index"]
        for share in shares:
            share.sort()
        others = {(r, batch_index): shares[r] for r in range(self.dp_size) if r != dp_rank}
        return shares[dp_rank], picked, others

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "length_field": self.length_field, "dp_size": self.dp_size, "n": self.groups.n}


class PickSampler:
    """One queue discipline for the samples a take may hand out: the oldest ready (``order="oldest"``, FIFO) or
    the newest (``"newest"``, LIFO); with ``ids``, only those samples (a take by id: nothing if none is ready);
    with ``after``, the first ready past that global index in the order, wrapping round to the start when none is.
    Built in so that the broker runs it inside its atomic take (persist-queue's FILO and get-by-id semantics)."""

    name = "pick"

    def __init__(self, order: str = "oldest", ids: Sequence[int] | None = None, after: int | None = None) -> None:
        if order not in ("oldest", "newest"):
            raise ConfigError(f"PickSampler order must be 'oldest' or 'newest', got {order!r}")
        if ids is not None and not all(type(i) is int and i >= 0 for i in ids):
            raise ConfigError(f"PickSampler ids must be global indexes (ints >= 0), got {ids!r}")
        if after is not None and (type(after) is not int or after < -1):
            raise ConfigError(f"PickSampler after must be a global index (an int >= -1), got {after!r}")
        self.order = order
        self.ids = None if ids is None else list(ids)
        self.after = after

    @accepts_ready_indexes
    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        candidates: Sequence[int] = ready
        if self.ids is not None:
            wanted = set(self.ids)
            candidates = [i for i in ready if i in wanted]
        if self.after is not None:
            a = self.after
            past = [i for i in candidates if (i > a if self.order == "oldest" else i < a)]
            candidates = past or candidates  # nothing past it: start over from the front of the order
        if self.order == "oldest":
            picked = list(candidates[:batch_size])
        else:  # the newest first, without reversing the whole backlog
            picked = list(reversed(candidates[max(0, len(candidates) - batch_size) :]))
        return picked, picked

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "order": self.order, "ids": self.ids, "after": self.after}


def from_wire(raw: Any) -> SequentialSampler | GRPOGroupNSampler | LengthBalancedSampler | PickSampler:
    """A built-in sampler from its ``to_wire()`` form (what the broker accepts)."""
    if raw is None:
        return SequentialSampler()
    if not isinstance(raw, dict):
        raise ConfigError(f"not a sampler description: {raw!r}")
    name = raw.get("name")
    if name == "sequential":
        return SequentialSampler()
    if name == "rank_aware":
        return RankAwareSampler()
    if name == "grpo":
        return GRPOGroupNSampler(raw.get("n"))  # type: ignore[arg-type]
    if name == "length_balanced":
        return LengthBalancedSampler(raw.get("length_field"), raw.get("dp_size"), raw.get("n", 1))  # type: ignore[arg-type]
    if name == "pick":
        return PickSampler(raw.get("order", "oldest"), raw.get("ids"), raw.get("after"))
    raise ConfigError(
        f"unknown sampler {name!r}; the broker knows sequential, rank_aware, grpo, length_balanced and pick"
    )
