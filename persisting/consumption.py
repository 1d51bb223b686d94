"""The consumption log: which samples each task has taken, which samples were cleared and the samples' tags,
kept across a restart and a kill -9.

One file per topic, ``<topic>/consumption.log``, of checksummed frames::

    frame = length u32 | crc32 u32 | msgpack record
    record = ["take", partition, task, [global indexes][, answers[, [request key, [indexes]]]]]
                                                            samples handed to task (consume-on-fetch);
                                                            answers: [[cache key, [indexes]], ...], what
                                                            RankAware/LengthBalanced give the other ranks
                                                            asking with those keys (in the same frame:
                                                            the take and its answers land together);
                                                            request key: the client's key for this take and
                                                            the batch it got, for a re-sent take
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
"""

from __future__ import annotations

import os
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from .errors import StorageError
from .samplers import RANK_CACHE_SIZE
from .wal import fsync_dir

_FRAME = struct.Struct("<II")
COMPACT_AT_BYTES = 4 * 1024 * 1024

Taken = dict[tuple[str, str], set[int]]
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
        pos = 0
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
            for (partition, task), indexes in state.taken.items():
                f.write(_frame(["taken", partition, task, _ranges(indexes)]))
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

    def append(self, record: list[Any], sync: bool = False) -> None:
        """Write one record (``sync``: and fdatasync it, so it survives a power loss too)."""
        if self._fd < 0:
            raise StorageError(f"{self.path} is not open")
        try:
            os.write(self._fd, _frame(record))
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
    body = msgpack.packb(record, use_bin_type=True)
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def remember_answers(answers: Answers, partition: str, task: str, entries: Any) -> None:
    """Put ``[(cache key, indexes), ...]`` of (partition, task) at the newest end of ``answers``; keep the latest
    RANK_CACHE_SIZE (replay and the engine's takes share this, so both keep the same ones)."""
    for key, indexes in entries:
        full = (partition, task, *key)
        answers.pop(full, None)
        answers[full] = [int(i) for i in indexes]
    while len(answers) > RANK_CACHE_SIZE:
        answers.popitem(last=False)


def remember_keys(keys: Keys, entries: Any) -> None:
    """``[(request key, indexes), ...]`` at the newest end of ``keys``; keep the latest TAKE_KEYS_KEPT."""
    for key, indexes in entries:
        keys.pop(str(key), None)
        keys[str(key)] = [int(i) for i in indexes]
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
    if kind == "take":
        taken.setdefault((partition, task), set()).update(int(i) for i in record[3])
        if len(record) > 4:
            remember_answers(answers, partition, task, record[4])
        if len(record) > 5:
            remember_keys(state.keys, [record[5]])
    elif kind == "answers":
        remember_answers(answers, partition, task, record[3])
    elif kind == "taken":
        target = taken.setdefault((partition, task), set())
        for lo, hi in record[3]:
            target.update(range(int(lo), int(hi)))
    elif kind == "reset":
        taken.pop((partition, task), None)
        for full in [k for k in answers if k[:2] == (partition, task)]:
            del answers[full]
    else:
        raise ValueError(f"unknown consumption record {kind!r}")
