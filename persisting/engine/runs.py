"""Run-length structures for the engine's bookkeeping: a put of N samples or a take of N samples costs a few
Python steps per run of consecutive indexes, not one per sample.

``IndexRuns``      a set of global indexes as sorted disjoint intervals (what a task took, per partition)
``PartitionIndex`` one partition's samples, ascending, as runs of consecutive global indexes with their positions
``Steps``          a value per position that changes rarely (a partition's field-set id per sample)
``runs_of``        a sequence of ints cut into runs of consecutive values, in its order (log frames)

Samples are put in batches whose indexes are consecutive, and samplers take from the front, so each structure
holds about one run per put (or per take that is out of order), usually far fewer: consecutive puts to one
partition merge into one run.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

Spans = list[list[int]]  # [start, stop] position spans within one run of a partition

SHORT_RUNS = 64  # below this many values, runs_of loops in Python instead of calling numpy (fixed cost ~10 us)


def runs_of(values: Sequence[int]) -> list[tuple[int, int]]:
    """``values`` as (first, count) runs of consecutive ascending values, in their order: ``[5, 6, 7, 2]`` ->
    ``[(5, 3), (2, 1)]``. Joining ``range(first, first + count)`` of every run gives ``values`` back."""
    n = len(values)
    if n == 0:
        return []
    first, last = int(values[0]), int(values[-1])
    if last - first == n - 1 and list(range(first, last + 1)) == list(values):
        return [(first, n)]  # a batch of the front: one comparison in C instead of a loop
    if n < SHORT_RUNS:
        out: list[tuple[int, int]] = []
        start = prev = int(values[0])
        for v in values[1:]:
            v = int(v)
            if v != prev + 1:
                out.append((start, prev - start + 1))
                start = v
            prev = v
        out.append((start, prev - start + 1))
        return out
    arr = np.asarray(values, dtype=np.int64)
    cuts = np.flatnonzero(np.diff(arr) != 1) + 1
    starts = np.concatenate(([0], cuts))
    counts = np.diff(np.concatenate((starts, [n])))
    return list(zip(arr[starts].tolist(), counts.tolist(), strict=True))


def expand(runs: Iterable[Sequence[int]]) -> list[int]:
    """The values of (first, count) runs, in order (the inverse of ``runs_of``)."""
    out: list[int] = []
    for first, count in runs:
        out.extend(range(int(first), int(first) + int(count)))
    return out


class IndexRuns:
    """A set of ints as sorted disjoint intervals ``[los[k], his[k])``, no two touching."""

    __slots__ = ("_size", "his", "los")

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []
        self._size = 0

    @classmethod
    def of(cls, values: Iterable[int]) -> IndexRuns:
        out = cls()
        out.update(values)
        return out

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __contains__(self, value: object) -> bool:
        try:
            value = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            return False
        k = bisect.bisect_right(self.los, value) - 1
        return k >= 0 and value < self.his[k]

    def __iter__(self) -> Iterator[int]:
        for lo, hi in zip(self.los, self.his, strict=True):
            yield from range(lo, hi)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IndexRuns):
            return self.los == other.los and self.his == other.his
        if isinstance(other, set | frozenset):
            return len(other) == self._size and all(v in self for v in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a set

    def __repr__(self) -> str:
        return f"IndexRuns({self.intervals()!r})"

    def intervals(self) -> list[list[int]]:
        """``[[lo, hi], ...]``: every value in ``range(lo, hi)`` is in the set (the log's snapshot form)."""
        return [[lo, hi] for lo, hi in zip(self.los, self.his, strict=True)]

    def add_range(self, lo: int, hi: int) -> None:
        """Add every value in ``[lo, hi)``."""
        if hi <= lo:
            return
        los, his = self.los, self.his
        if not los or lo > his[-1]:  # past the end: the usual case (takes from the front, puts in order)
            los.append(lo)
            his.append(hi)
            self._size += hi - lo
            return
        if lo == his[-1]:
            his[-1] = hi
            self._size += hi - lo
            return
        i = bisect.bisect_left(his, lo)  # the first interval ending at or after lo: it touches or follows
        j = bisect.bisect_right(los, hi)  # intervals from i up to j touch [lo, hi)
        if i == j:
            los.insert(i, lo)
            his.insert(i, hi)
            self._size += hi - lo
            return
        new_lo, new_hi = min(lo, los[i]), max(hi, his[j - 1])
        covered = sum(h - low for low, h in zip(los[i:j], his[i:j], strict=True))
        los[i:j] = [new_lo]
        his[i:j] = [new_hi]
        self._size += new_hi - new_lo - covered

    def discard_range(self, lo: int, hi: int) -> None:
        """Remove every value in ``[lo, hi)``."""
        los, his = self.los, self.his
        i = bisect.bisect_right(his, lo)  # the first interval ending after lo
        j = bisect.bisect_left(los, hi)  # intervals from i up to j overlap [lo, hi)
        if hi <= lo or i >= j:
            return
        removed = sum(min(h, hi) - max(low, lo) for low, h in zip(los[i:j], his[i:j], strict=True))
        kept_los, kept_his = [], []
        if los[i] < lo:
            kept_los.append(los[i])
            kept_his.append(lo)
        if his[j - 1] > hi:
            kept_los.append(hi)
            kept_his.append(his[j - 1])
        los[i:j] = kept_los
        his[i:j] = kept_his
        self._size -= removed

    def discard(self, values: Sequence[int]) -> None:
        """Remove ints in any order."""
        for first, count in runs_of(sorted(values)):
            self.discard_range(first, first + count)

    def update(self, values: Iterable[int]) -> None:
        """Add ints in any order (a take's batch, a mark_consumed's list)."""
        seq = values if isinstance(values, Sequence) else list(values)
        if len(seq) >= SHORT_RUNS:
            seq = np.unique(np.asarray(seq, dtype=np.int64)).tolist()  # order does not matter in a set
        for first, count in runs_of(seq):
            self.add_range(first, first + count)

    def add_runs(self, runs: Iterable[Sequence[int]]) -> None:
        """Add (first, count) runs."""
        for first, count in runs:
            self.add_range(int(first), int(first) + int(count))

    def gap(self, value: int) -> tuple[int, int | None]:
        """(the first int from ``value`` on that is not in the set, the start of the next interval after it or None
        when none follows): one bisect."""
        los = self.los
        k = bisect.bisect_right(los, value) - 1
        if k >= 0 and value < self.his[k]:
            value = self.his[k]
        return value, (los[k + 1] if k + 1 < len(los) else None)

    def end_of(self, value: int) -> int:
        """The end of the interval holding ``value``, or ``value`` itself when no interval holds it."""
        k = bisect.bisect_right(self.los, value) - 1
        if k >= 0 and value < self.his[k]:
            return self.his[k]
        return value

    def next_start(self, value: int) -> int | None:
        """The start of the first interval beginning after ``value`` (None: none does)."""
        k = bisect.bisect_right(self.los, value)
        return self.los[k] if k < len(self.los) else None


class PartitionIndex:
    """The global indexes of one partition's samples in ascending order, as runs of consecutive indexes: run
    ``k`` holds ``firsts[k]`` up to the next run's position, and starts at position ``starts[k]`` (a sample's
    position: how many samples of the partition come before it)."""

    __slots__ = ("firsts", "starts", "total")

    def __init__(self) -> None:
        self.firsts: list[int] = []
        self.starts: list[int] = []
        self.total = 0

    @classmethod
    def of(cls, indexes: Sequence[int] | np.ndarray) -> PartitionIndex:
        """From ascending global indexes."""
        out = cls()
        arr = np.asarray(indexes, dtype=np.int64)
        if len(arr):
            cuts = np.flatnonzero(np.diff(arr) != 1) + 1
            out.starts = [0, *cuts.tolist()]
            out.firsts = arr[out.starts].tolist()
            out.total = len(arr)
        return out

    def __len__(self) -> int:
        return self.total

    def append(self, first: int, count: int) -> None:
        """Samples ``first .. first+count-1``, after every sample already here."""
        if count <= 0:
            return
        if self.firsts and self.firsts[-1] + self.total - self.starts[-1] == first:
            self.total += count  # the next indexes: the last run grows
            return
        self.firsts.append(first)
        self.starts.append(self.total)
        self.total += count

    def _count(self, k: int) -> int:
        return (self.starts[k + 1] if k + 1 < len(self.starts) else self.total) - self.starts[k]

    def position(self, index: int) -> int:
        """The position of sample ``index`` (-1: not a sample of this partition)."""
        k = bisect.bisect_right(self.firsts, index) - 1
        if k < 0:
            return -1
        offset = index - self.firsts[k]
        return self.starts[k] + offset if offset < self._count(k) else -1

    def __contains__(self, index: object) -> bool:
        try:
            return self.position(operator.index(index)) >= 0  # type: ignore[arg-type]
        except TypeError:
            return False

    def at(self, position: int) -> int:
        """The global index of the sample at ``position`` (0 <= position < len)."""
        k = bisect.bisect_right(self.starts, position) - 1
        return self.firsts[k] + position - self.starts[k]

    def run_at(self, position: int) -> tuple[int, int]:
        """(global index at ``position``, samples left in its run from there), 0 <= position < len."""
        k = bisect.bisect_right(self.starts, position) - 1
        offset = position - self.starts[k]
        return self.firsts[k] + offset, self._count(k) - offset

    def below(self, index: int) -> int:
        """How many samples have a global index below ``index`` (``bisect_left`` of the ascending list)."""
        k = bisect.bisect_left(self.firsts, index)
        if k == 0:
            return 0
        return self.starts[k - 1] + min(self._count(k - 1), index - self.firsts[k - 1])

    def runs(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """(first global index, its position, count) of the runs covering positions ``[lo, hi)``, clipped."""
        if lo >= hi:
            return
        starts, firsts = self.starts, self.firsts
        k = bisect.bisect_right(starts, lo) - 1
        while k < len(starts) and starts[k] < hi:
            start = max(starts[k], lo)
            stop = min(starts[k + 1] if k + 1 < len(starts) else self.total, hi)
            if stop > start:
                yield firsts[k] + start - starts[k], start, stop - start
            k += 1

    def __iter__(self) -> Iterator[int]:
        for first, _position, count in self.runs(0, self.total):
            yield from range(first, first + count)

    def to_list(self, upto: int | None = None) -> list[int]:
        """The global indexes at positions ``[0, upto)`` (None: all)."""
        out: list[int] = []
        for first, _position, count in self.runs(0, self.total if upto is None else upto):
            out.extend(range(first, first + count))
        return out


class Steps:
    """A value per position ``0 ..`` as steps: ``values[k]`` holds from ``starts[k]`` up to the next step."""

    __slots__ = ("starts", "total", "values")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.values: list[int] = []
        self.total = 0

    def __len__(self) -> int:
        return self.total

    def append(self, count: int, value: int) -> None:
        """The next ``count`` positions hold ``value``."""
        if count <= 0:
            return
        if not self.values or self.values[-1] != value:
            self.starts.append(self.total)
            self.values.append(value)
        self.total += count

    def extend(self, values: Iterable[int]) -> None:
        """The next positions hold these values, one each."""
        for value in values:
            self.append(1, value)

    def __getitem__(self, position: int) -> int:
        if not 0 <= position < self.total:
            raise IndexError(position)
        return self.values[bisect.bisect_right(self.starts, position) - 1]

    def spans(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """(start, stop, value) of the steps covering positions ``[lo, hi)``, clipped."""
        starts, values = self.starts, self.values
        k = max(0, bisect.bisect_right(starts, lo) - 1)
        while k < len(starts) and starts[k] < hi:
            start = max(starts[k], lo)
            stop = min(starts[k + 1] if k + 1 < len(starts) else self.total, hi)
            if stop > start:
                yield start, stop, values[k]
            k += 1


def value_runs(values: np.ndarray) -> list[tuple[int, int]]:
    """(count, value) runs of equal consecutive values."""
    if not len(values):
        return []
    cuts = np.flatnonzero(np.diff(values) != 0) + 1
    starts = np.concatenate(([0], cuts))
    counts = np.diff(np.concatenate((starts, [len(values)])))
    return list(zip(counts.tolist(), values[starts].tolist(), strict=True))


def without(spans: Spans, offset: int, members: Any) -> Spans:
    """``spans`` minus the positions whose global index (position + ``offset``) is in ``members`` (a set or a
    dict's keys): a C-level pass over a span that holds none of them, else one step per position."""
    out: Spans = []
    for a, b in spans:
        if members.isdisjoint(range(a + offset, b + offset)):
            out.append([a, b])
            continue
        run_start = -1
        for p in range(a, b):
            if p + offset in members:
                if run_start >= 0:
                    out.append([run_start, p])
                    run_start = -1
            elif run_start < 0:
                run_start = p
        if run_start >= 0:
            out.append([run_start, b])
    return out
