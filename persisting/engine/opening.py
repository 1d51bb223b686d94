"""Opening a topic: its lock, its stored settings, and recovery from whatever the last process left.

Functions that ``topic.Topic.open`` calls in this order, on the engine's loop (``open_files`` on a thread):

1. ``open_files`` takes the topic's flock (one process per topic; another gets ``TopicLockedError`` naming the
   holder's pid), checks ``topic.json`` against the asked settings (a mismatch is a ``ConfigError``), reads
   ``schema.json`` and ``state.json``, opens the write-ahead log, replays the consumption log (takes, clears,
   tags, rank answers, take keys) and opens one backend per bucket (a bucket folder whose first commit never
   landed is started afresh there);
2. the buckets read their index columns (strictly increasing, or ``CorruptionError``);
3. ``replay`` puts the write-ahead log above ``flushed_upto`` back into the tail: the rows of an arena batch are
   re-adopted from the arena a killed broker left behind (``readopt``), retry keys are remembered again;
4. the topic completes the flush a crash interrupted, purges the rows of cleared samples before anything reads,
   and starts the background flush loop.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, CorruptionError, ProtocolError, StorageError, TopicLockedError
from ..tensors import jagged
from ..tensors.column import AnyColumn, Column, storage_dtype
from . import spooled
from .buckets import Buckets
from .config import TopicConfig
from .consumption import ConsumptionLog, Taken
from .layout import read_json, write_json_atomic
from .location import ObjectStoreTopic
from .schema import Schema
from .tail import ArenaPayload, Chunk, Tail, materialize
from .wal import WriteAheadLog

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# (arena generation, offset, nbytes) -> a view of those bytes in that arena, or None when that arena is gone.
ArenaResolver = Callable[[bytes, int, int], np.ndarray | None]


@dataclass(slots=True)
class OpenedFiles:
    lock_fd: int  # flock'ed; closing it releases the topic
    flushed_upto: int  # from state.json: every index below it is in the backends
    wal: WriteAheadLog
    taken: Taken  # what each task had taken, from the consumption log


def open_files(
    path: Path,
    name: str,
    config: TopicConfig,
    backend_name: str,
    schema: Schema,
    consumption: ConsumptionLog,
    buckets: Buckets,
    remote: ObjectStoreTopic | None = None,
) -> OpenedFiles:
    """Step 1 (blocking). On failure every file it opened is closed again."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StorageError(f"cannot create topic folder {path}: {exc}") from exc
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(lock_fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(lock_fd)
        raise TopicLockedError(
            f"topic {name!r} at {path} is open in another process (pid {holder}); "
            "embedded mode serves one process: run persisting-broker to share a topic"
        ) from None
    try:
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, str(os.getpid()).encode(), 0)
        _check_settings(path, name, config, backend_name, remote)
        schema.load(read_json(path / "schema.json") or {})
        state = read_json(path / "state.json") or {}
        wal = WriteAheadLog(path / "wal", sync=config.durability == "sync")
        taken = consumption.open()
        buckets.create()
    except BaseException:
        os.close(lock_fd)
        raise
    return OpenedFiles(lock_fd, int(state.get("flushed_upto", 0)), wal, taken)


def _check_settings(
    path: Path, name: str, config: TopicConfig, backend_name: str, remote: ObjectStoreTopic | None
) -> None:
    meta = {
        "format": FORMAT_VERSION,
        "name": name,
        "num_buckets": config.num_buckets,
        "bucket_column": config.bucket_column,
        "backend": backend_name,
    }
    if remote is not None:  # the object store's lease, and its settings and schema on a fresh node
        remote.attach(path, meta)
    stored = read_json(path / "topic.json")
    if stored is None:
        write_json_atomic(path / "topic.json", meta)
        return
    for key in ("num_buckets", "bucket_column", "backend"):
        if stored.get(key) != meta[key]:
            raise ConfigError(
                f"topic {name!r} was created with {key}={stored.get(key)!r}, "
                f"this Queue asks for {key}={meta[key]!r}; pass the stored value "
                "(or use a new topic name)"
            )


def replay(
    name: str,
    wal: WriteAheadLog,
    flushed_upto: int,
    top: int,
    tail: Tail,
    schema: Schema,
    remember: Callable[[str, int, int], None],
    resolver: ArenaResolver | None,
) -> int:
    """Step 3: the log's frames above ``flushed_upto`` into ``tail``; returns the next global index (above
    ``top``, the largest index stored anywhere)."""
    top = max(flushed_upto - 1, top)
    spools: set[str] = set()  # spool files (spooled.py) the replayed frames still need
    for frame in wal.replay():
        partition, new_kinds, key, ref, patch = (*frame.header, None, None, None)[:5]
        schema.add(new_kinds)
        if key is not None:
            remember(key, frame.first_index, frame.count)
        end = frame.first_index + frame.count
        top = max(top, end - 1)
        if end <= flushed_upto:
            continue
        rows = frame.rows()
        if isinstance(ref, dict) and "spool" in ref:  # a batch larger than the arena, stored from its file
            spools.add(str(ref["spool"]))
            tail.add(spooled.replayed(wal.directory, ref, rows, frame.first_index, partition))
            continue
        if ref is not None:
            rows = readopt(name, ref, rows, frame.first_index, resolver)
        if patch is not None:
            patch = ([int(i) for i in patch[0]], [str(f) for f in patch[1]])
        tail.add(Chunk(frame.first_index, partition, rows, whole=ref is not None, patch=patch))
    spooled.sweep(wal.directory.parent, spools)  # files of producers killed mid-write, or already flushed
    return top + 1


def readopt(
    name: str, ref: Any, rows: list[dict[str, Any]], first: int, resolver: ArenaResolver | None
) -> list[dict[str, Any]]:
    """Rows of a logged arena batch, with its payload copied from the arena a killed broker left behind."""
    try:
        generation, base, fields = bytes(ref["gen"]), int(ref["offset"]), ref["fields"]
        n = len(rows)
        columns: dict[str, AnyColumn] = {}
        for entry in fields:
            field_name, kind, dtype_name, shape, offset, nbytes = entry[:6]
            view = None if resolver is None else resolver(generation, base + offset, nbytes)
            if view is None:
                log.error(
                    "topic %r: the tensor payload of rows %d..%d (field %r) was in a shared-memory arena that "
                    "is gone (the machine restarted before it was flushed); those fields read back as None",
                    name,
                    first,
                    first + n - 1,
                    field_name,
                )
                continue
            if kind == jagged.KIND and resolver is not None:
                at = functools.partial(_resolved, resolver, generation)
                columns[field_name] = jagged.from_arena(entry, n, at, None, base)
                continue
            arr = view.view(storage_dtype(kind, dtype_name)).reshape((n, *shape))
            columns[field_name] = Column(kind, dtype_name, arr)
    except (KeyError, TypeError, ValueError, ProtocolError) as exc:
        raise CorruptionError(f"topic {name!r}: a log frame's arena reference is malformed: {exc}") from exc
    return materialize(rows, ArenaPayload(0, ref, columns))


def _resolved(resolver: ArenaResolver, generation: bytes, offset: int, nbytes: int) -> Any:
    view = resolver(generation, offset, nbytes)
    if view is None:
        raise ValueError("a jagged field's offsets are outside the arena left behind")
    return view


def stored_topics(storage_path: Path, backend_kwargs: dict[str, Any]) -> list[tuple[str, TopicConfig]]:
    """The topics stored under ``storage_path`` with the settings they were created with (a broker re-adopting
    an arena a killed broker left opens each one)."""
    found = []
    for meta_file in sorted(storage_path.glob("*/topic.json")):
        meta = read_json(meta_file) or {}
        name = meta.get("name")
        if not isinstance(name, str):
            continue
        config = TopicConfig(
            num_buckets=int(meta.get("num_buckets", 4)),
            bucket_column=str(meta.get("bucket_column", "id")),
            backend_kwargs=dict(backend_kwargs),
        )
        found.append((name, config))
    return found
