"""The consumption log: which samples each task has taken, which samples were cleared and the samples' tags,
kept across a restart and a kill -9.

One file per topic, ``<topic>/consumption.log``, of checksummed frames::

    frame = length u32 | crc32 u32 | msgpack record
    record = ["took", partition, task, runs[, answers[, [request key, runs]]]]
                                                            samples handed to task (consume-on-fetch), as
                                                            runs [[first, count], ...] of consecutive global
                                                            indexes, in the batch's order;
                                                            answers: [[cache key, [indexes]], ...], what
                                                            RankAware/LengthBalanced give the other ranks
                                                            asking with those keys (in the same frame:
                                                            the take and its answers land together);
                                                            request key: the client's key for this take and
                                                            the batch it got (runs), for a re-sent take
           | ["take", partition, task, [global indexes][, answers[, [request key, [indexes]]]]]
                                                            the same with every index listed (written
                                                            before the runs; still read)
           | ["answers", partition, task, answers]          a snapshot of remembered answers
           | ["keys", [[request key, [indexes]], ...]]      a snapshot of remembered take keys
           | ["reset", partition, task]                     reset_consumption: the task starts over
           | ["taken", partition, task, [[lo, hi], ...]]    a snapshot: every index in these ranges is taken
           | ["clear", partition, [global indexes]]         clear(): the samples are deleted
           | ["cleared", partition, [[lo, hi], ...]]        a snapshot of cleared samples
           | ["tags", partition, [[index, {key: value}], ...]]   set_custom_meta(): merged into the samples' tags
                                                            (also the snapshot of a partition's tags)

A take is written (write(2), no fsync) before its answer leaves the engine, so a kill -9 of the process keeps it;
a power loss may forget the last takes (those samples are then handed out again: at-least-once per power loss).
A broker client gives each take a request key that rides in its frame: when the broker dies between writing the
take and the answer reaching the client, the client's re-sent take (same key) gets the same batch from the
restarted broker, so a crash loses no batch (exactly-once per process crash). Clears and tags are written before
their call returns, and fdatasync'ed too when the topic's durability is "sync". Replay stops at the first torn or
corrupt frame and cuts the file there. At open, a log longer than ``COMPACT_AT_BYTES`` is rewritten as one
snapshot (tmp file, fsync, rename).

In memory, ``Consumption`` is one task's state in one partition: what it took (intervals of global indexes,
``runs.IndexRuns``), what it holds leased (``Leases``, one entry per take) and where its scans start.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import msgspec

from ..errors import StorageError
from ..tensors.arena import Peer, peer_alive
from .runs import IndexRuns, PartitionIndex, expand
from .samplers import RANK_CACHE_SIZE
from .wal import fsync_dir

_FRAME = struct.Struct("<II")
# The same msgpack bytes as msgpack.packb(use_bin_type=True) for the plain values records hold, in a seventh of the
# time (a take writes one record before it answers); anything it does not take goes through msgpack as before.
_encode = msgspec.msgpack.Encoder().encode
COMPACT_AT_BYTES = 4 * 1024 * 1024

Taken = dict[tuple[str, str], IndexRuns]
Cleared = dict[str, set[int]]  # partition -> its cleared samples
Tags = dict[str, dict[int, dict[str, Any]]]  # partition -> global index -> that sample's tags
Answers = OrderedDict[tuple[Any, ...], list[int]]  # (partition, task, *cache key) -> the batch, oldest first
Keys = OrderedDict[str, list[int]]  # a take's request key -> the batch it got, oldest first
TAKE_KEYS_KEPT = 65_536  # recent take keys remembered for re-sent takes (clients retry for 30 s by default)


@dataclass(slots=True)
class Replayed:
    """What the log says: per (partition, task) what it took, the cleared samples, tags, answers and keys."""

    taken: Taken = field(default_factory=dict)
    cleared: Cleared = field(default_factory=dict)
    tags: Tags = field(default_factory=dict)
    answers: Answers = field(default_factory=OrderedDict)
    keys: Keys = field(default_factory=OrderedDict)


def _ranges(indexes: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in sorted(indexes):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


class Leases:
    """The samples a task holds leased (acknowledged delivery), kept per take: a lease of N samples is one
    entry, so looking for ended leases costs one step per lease, not per sample; ``held`` has them as intervals,
    so a take passes over a leased run in one step."""

    __slots__ = ("_by_index", "_leases", "_next_id", "held")

    def __init__(self) -> None:
        self._by_index: dict[int, int] = {}  # sample -> the lease holding it
        # lease id -> [loop time it ends, the process holding it or None, its samples, how many it still holds]
        self._leases: dict[int, list[Any]] = {}
        self._next_id = 0
        self.held = IndexRuns()

    def __len__(self) -> int:
        return len(self._by_index)

    def __bool__(self) -> bool:
        return bool(self._by_index)

    def __contains__(self, index: object) -> bool:
        return index in self._by_index

    def lease(self, indexes: Sequence[int], until: float, holder: Peer | None) -> None:
        fresh = dict.fromkeys(indexes, self._next_id)
        if not fresh:
            return
        if not self._by_index.keys().isdisjoint(fresh):  # leased again: the new lease holds them
            self.release(list(fresh))
        self._by_index.update(fresh)
        self.held.update(list(fresh))
        self._leases[self._next_id] = [until, holder, list(fresh), len(fresh)]
        self._next_id += 1

    def pop(self, index: int, default: Any = None) -> Any:
        """Forget the lease of one sample (consumed or cleared); returns its lease id, or ``default``."""
        lease_id = self._forget(index)
        if lease_id is None:
            return default
        self.held.discard_range(index, index + 1)
        return lease_id

    def release(self, indexes: Sequence[int]) -> None:
        """Forget the leases of these samples (consumed or cleared), those that have one."""
        gone = [index for index in indexes if self._forget(index) is not None]
        if gone:
            self.held.discard(gone)

    def _forget(self, index: int) -> int | None:
        lease_id = self._by_index.pop(index, None)
        if lease_id is not None:
            entry = self._leases[lease_id]
            entry[3] -= 1
            if entry[3] == 0:
                del self._leases[lease_id]
        return lease_id

    def expire(self, now: float) -> float | None:
        """Drop leases that ended or whose holder died; returns when the next one ends (None: none left)."""
        alive: dict[Peer, bool] = {}
        nearest = None
        by_index = self._by_index
        for lease_id, (until, holder, indexes, _held) in list(self._leases.items()):
            if holder is not None and holder not in alive:
                alive[holder] = peer_alive(holder)
            if until <= now or (holder is not None and not alive[holder]):
                del self._leases[lease_id]
                gone = [index for index in indexes if by_index.get(index) == lease_id]
                for index in gone:
                    del by_index[index]
                self.held.discard(gone)
            elif nearest is None or until < nearest:
                nearest = until
        return nearest


class Consumption:
    """What one task has taken from one partition (``done``, intervals of global indexes); every sample at a
    position below ``floor`` of the partition's index is taken or cleared (so scans start there)."""

    __slots__ = ("done", "floor", "leased")

    def __init__(self, done: IndexRuns | Iterable[int] | None = None) -> None:
        self.floor = 0
        self.done = done if isinstance(done, IndexRuns) else IndexRuns.of(done or ())
        self.leased = Leases()

    def expire(self, now: float) -> float | None:
        """Drop leases that ended or whose holder died; returns when the next one ends (None: none left)."""
        return self.leased.expire(now)

    def advance_floor(self, indexes: PartitionIndex, cleared: set[int] | None) -> None:
        """Move ``floor`` to the first position of the partition at or after it whose sample is neither taken nor
        cleared: one step per taken interval (and per cleared sample) passed."""
        p, total, done = self.floor, len(indexes), self.done
        while p < total:
            index, left = indexes.run_at(p)
            end = done.end_of(index)
            if end > index:
                p += min(end - index, left)
            elif cleared and index in cleared:
                p += 1
            else:
                break
        self.floor = p


class ConsumptionLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self.state = Replayed()  # filled by open()

    @property
    def cleared(self) -> Cleared:
        return self.state.cleared

    @property
    def tags(self) -> Tags:
        return self.state.tags

    @property
    def answers(self) -> Answers:
        return self.state.answers  # the latest RANK_CACHE_SIZE

    @property
    def keys(self) -> Keys:
        return self.state.keys  # the latest TAKE_KEYS_KEPT

    def open(self) -> Taken:
        """Replay the log (cutting a torn tail), compact it if long, and keep it open for appends. Returns what
        each task took; ``cleared``, ``tags``, ``answers`` and ``keys`` hold the rest."""
        state = self.state = Replayed()
        try:
            data = self.path.read_bytes() if self.path.exists() else b""
        except OSError as exc:
            raise StorageError(f"cannot read {self.path}: {exc}") from exc
        pos = replay_frames(data, state)
        try:
            if pos >= COMPACT_AT_BYTES or pos < len(data):
                self._rewrite(state)  # a long log gets short again; a torn tail is cut
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"cannot open {self.path}: {exc}") from exc
        return state.taken

    def _rewrite(self, state: Replayed) -> None:
        cleared = state.cleared
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for (partition, task), taken in state.taken.items():
                f.write(_frame(["taken", partition, task, taken.intervals()]))
            for partition, indexes in cleared.items():
                f.write(_frame(["cleared", partition, _ranges(indexes)]))
            for partition, tagged in state.tags.items():
                gone = cleared.get(partition, set())
                kept = [[i, t] for i, t in tagged.items() if i not in gone]  # a cleared sample's tags go with it
                if kept:
                    f.write(_frame(["tags", partition, kept]))
            for (partition, task, *key), batch in state.answers.items():  # one frame each: their order is kept
                f.write(_frame(["answers", partition, task, [[key, batch]]]))
            if state.keys:
                f.write(_frame(["keys", [[key, batch] for key, batch in state.keys.items()]]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)

    def append(self, *records: list[Any], sync: bool = False) -> None:
        """Write records, in one write (``sync``: and fdatasync them, so they survive a power loss too; the
        replay stops at the first torn frame, so a later record never survives without an earlier one)."""
        if self._fd < 0:
            raise StorageError(f"{self.path} is not open")
        try:
            os.write(self._fd, b"".join(_frame(record) for record in records))
            if sync:
                os.fdatasync(self._fd)
        except OSError as exc:
            raise StorageError(f"cannot write {self.path}: {exc}") from exc

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1


def _frame(record: list[Any]) -> bytes:
    try:
        body = _encode(record)
    except TypeError:
        body = msgpack.packb(record, use_bin_type=True)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def replay_frames(data: bytes, state: Replayed, pos: int = 0) -> int:
    """Apply the records of ``data`` from ``pos`` to ``state``, up to the first torn, corrupt or unknown one;
    returns where that one starts (``len(data)``: none)."""
    while pos + _FRAME.size <= len(data):
        size, crc = _FRAME.unpack_from(data, pos)
        body = data[pos + _FRAME.size : pos + _FRAME.size + size]
        if len(body) < size or zlib.crc32(body) != crc:
            break
        try:
            _apply(state, msgpack.unpackb(body, raw=False, use_list=True))
        except (ValueError, TypeError, msgpack.UnpackException):
            break
        pos += _FRAME.size + size
    return pos


def frame_end(data: bytes, pos: int) -> int:
    """Where the frame at ``pos`` ends by its length field (checksum not verified; past ``len(data)`` if cut)."""
    if pos + _FRAME.size > len(data):
        return len(data) + 1
    return pos + _FRAME.size + _FRAME.unpack_from(data, pos)[0]


def remember_answers(answers: Answers, partition: str, task: str, entries: Any) -> None:
    """Put ``[(cache key, indexes), ...]`` of (partition, task) at the newest end of ``answers``; keep the latest
    RANK_CACHE_SIZE (replay and the engine's takes share this, so both keep the same ones)."""
    for key, indexes in entries:
        full = (partition, task, *key)
        answers.pop(full, None)
        answers[full] = list(map(int, indexes))
    while len(answers) > RANK_CACHE_SIZE:
        answers.popitem(last=False)


def remember_keys(keys: Keys, entries: Any) -> None:
    """``[(request key, indexes), ...]`` at the newest end of ``keys``; keep the latest TAKE_KEYS_KEPT."""
    for key, indexes in entries:
        keys.pop(str(key), None)
        keys[str(key)] = list(map(int, indexes))
    while len(keys) > TAKE_KEYS_KEPT:
        keys.popitem(last=False)


def _apply(state: Replayed, record: Any) -> None:
    kind = record[0]
    if kind == "keys":
        remember_keys(state.keys, record[1])
        return
    partition, taken, cleared, tags, answers = str(record[1]), state.taken, state.cleared, state.tags, state.answers
    if kind == "tags":
        tagged = tags.setdefault(partition, {})
        for index, values in record[2]:
            tagged.setdefault(int(index), {}).update(dict(values))
        return
    if kind == "clear":
        cleared.setdefault(partition, set()).update(int(i) for i in record[2])
        return
    if kind == "cleared":
        target = cleared.setdefault(partition, set())
        for lo, hi in record[2]:
            target.update(range(int(lo), int(hi)))
        return
    task = str(record[2])
    if kind == "took":
        taken.setdefault((partition, task), IndexRuns()).add_runs(record[3])
        if len(record) > 4:
            remember_answers(answers, partition, task, record[4])
        if len(record) > 5:
            remember_keys(state.keys, [[record[5][0], expand(record[5][1])]])
    elif kind == "take":
        taken.setdefault((partition, task), IndexRuns()).update([int(i) for i in record[3]])
        if len(record) > 4:
            remember_answers(answers, partition, task, record[4])
        if len(record) > 5:
            remember_keys(state.keys, [record[5]])
    elif kind == "answers":
        remember_answers(answers, partition, task, record[3])
    elif kind == "taken":
        runs = taken.setdefault((partition, task), IndexRuns())
        for lo, hi in record[3]:
            runs.add_range(int(lo), int(hi))
    elif kind == "reset":
        taken.pop((partition, task), None)
        for full in [k for k in answers if k[:2] == (partition, task)]:
            del answers[full]
    else:
        raise ValueError(f"unknown consumption record {kind!r}")
