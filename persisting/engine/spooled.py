"""Tensor batches larger than the arena: written once to a spool file of the topic, stored from there.

A batch too big for the broker's arena (or, embedded, above ``tensors.pieces.SPOOL_ABOVE_BYTES``) is not
copied over the socket nor encoded into rows (each would hold the whole batch a second time). Its producer writes
the tensors, field after field in pieces, into a fresh *part* file ``<topic>/spool/<pid>-<uuid>.part`` (the one
copy it gets: into the page cache), then asks the engine to store it (``put_spooled``): the file is synced and
renamed ``.spool``, one log frame references it (as an arena batch references its extent), the put is
acknowledged, the topic serves the batch from a read-only mapping of the file, flushes it to the backends in the
background (columns straight from the mapping), and deletes the file once they hold it. Life of a spool file::

    <pid>-<uuid>.part ──put_spooled: fdatasync, rename──▶ .spool ──flushed──▶ unlinked
        │  (the producer died, or the put was refused)           │ (a crash before the unlink)
        └──▶ swept (``sweep``: its writer is dead)                └──▶ swept at open once stored (``sweep``)

Atomicity: the batch's rows exist only from its log frame on, and the frame is written once the whole file is
there, so a producer killed while writing leaves a part file and no sample. A frame that references a spool file
is replayed from it (``replayed``) after a crash; one whose rows reached the backends before the crash needs it
no more (replay skips flushed rows), which is why the file is deleted only after the flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, CorruptionError, ProtocolError
from ..tensors.column import AnyColumn, Column, storage_dtype
from ..wire.codec import EncodedBatch
from .tail import ArenaPayload, Chunk

log = logging.getLogger(__name__)

SPOOL_DIRNAME = "spool"
PART_SUFFIX = ".part"
SPOOL_SUFFIX = ".spool"
_NAME = re.compile(r"^(\d+)-[0-9a-f]{32}$")
# Spool payloads take ids below zero so that they never meet the arena's extent ids (broker/extents.py).
_payload_ids = itertools.count(1)


def spool_dir(topic_path: Path) -> Path:
    return topic_path / SPOOL_DIRNAME


def part_path(topic_path: Path, name: str) -> Path:
    """The part file ``name`` of a topic; refuses names that are not ``<pid>-<32 hex>``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProtocolError(f"spool name {str(name)[:80]!r} is not <pid>-<32 hex digits>")
    return spool_dir(topic_path) / (name + PART_SUFFIX)


def new_part(topic_path: Path, pid: int) -> tuple[str, Path]:
    """Create an empty part file for a writer process ``pid`` (group-writable: the producer may be another
    process of the service's group); returns (name, path)."""
    import uuid

    directory = spool_dir(topic_path)
    directory.mkdir(mode=0o770, exist_ok=True)
    name = f"{int(pid)}-{uuid.uuid4().hex}"
    path = directory / (name + PART_SUFFIX)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o660)
    os.close(fd)
    return name, path


def check_fields(fields: Any, n: int, size_bytes: int) -> list[list[Any]]:
    """A spooled batch's layout: ``[name, kind, dtype, sample shape, offset, nbytes]`` per dense field, each
    inside the file and exactly ``n`` samples long."""
    if not isinstance(fields, list) or not fields:
        raise ProtocolError("a spooled put needs its fields: [[name, kind, dtype, shape, offset, nbytes], ...]")
    out = []
    for entry in fields:
        if not (isinstance(entry, list) and len(entry) == 6 and isinstance(entry[0], str) and entry[0]):
            raise ProtocolError("each spooled field is [name, kind, dtype, shape, offset, nbytes]")
        name, kind, dtype_name, shape, offset, nbytes = entry
        if kind not in ("ndarray", "tensor") or not isinstance(dtype_name, str) or not isinstance(shape, list):
            raise ProtocolError(f"spooled field {name!r}: kind, dtype or shape is malformed")
        if not all(type(d) is int and d >= 0 for d in shape):
            raise ProtocolError(f"spooled field {name!r}: shape {shape!r} is not a list of ints >= 0")
        try:
            itemsize = storage_dtype(kind, dtype_name).itemsize
        except (TypeError, ValueError, ConfigError) as exc:
            raise ProtocolError(f"spooled field {name!r}: unknown dtype {dtype_name!r}") from exc
        want = n * int(np.prod(shape, dtype=np.int64)) * itemsize
        if type(offset) is not int or type(nbytes) is not int or nbytes != want or offset < 0:
            raise ProtocolError(f"spooled field {name!r}: {nbytes!r} bytes at {offset!r} do not fit {n}x{shape}")
        if offset + nbytes > size_bytes:
            raise ProtocolError(f"spooled field {name!r} lies outside its file ({size_bytes} bytes)")
        out.append([name, kind, dtype_name, list(shape), offset, nbytes])
    return out


def columns_of(path: Path, fields: list[list[Any]], n: int) -> dict[str, AnyColumn]:
    """Read-only views of a spool file's fields (one shared mapping: the page cache, no copy)."""
    size = path.stat().st_size
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,)) if size else np.zeros(0, np.uint8)
    out: dict[str, AnyColumn] = {}
    for name, kind, dtype_name, shape, offset, nbytes in fields:
        arr = mm[offset : offset + nbytes].view(storage_dtype(kind, dtype_name)).reshape((n, *shape))
        out[name] = Column(kind, dtype_name, arr)
    return out


def _seal(part: Path) -> Path:
    """Make a written part file durable and name it a spool file (the rename is what the log frame points to)."""
    sealed = part.with_suffix(SPOOL_SUFFIX)
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(part, sealed)
    dfd = os.open(part.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return sealed


async def put_spooled(
    topic: Any,
    batch: EncodedBatch,
    partition: str,
    rows_blob: bytes,
    key: str | None,
    name: str,
    fields: Any,
    of: list[int] | None = None,
) -> tuple[int, int]:
    """Store the batch whose tensors a producer wrote into the part file ``name`` of ``topic`` (an engine
    ``Topic``, on its loop); returns (first global index, count) once acknowledged."""
    part = part_path(topic.path, name)
    n = len(batch.rows)
    try:
        size = part.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"spool file {name!r} is gone (the broker restarted, or it was swept); put again") from None
    try:
        checked = check_fields(fields, n, size)
        sealed = await asyncio.to_thread(_seal, part)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise
    try:
        columns = columns_of(sealed, checked, n)
        kinds = {**batch.kinds, **{f[0]: f[1] for f in checked}}
        payload = ArenaPayload(-next(_payload_ids), {"spool": sealed.name, "fields": checked}, columns)
        payload.on_stored = _unlinker(sealed)
        first, count = await topic.append(EncodedBatch(batch.rows, kinds), partition, rows_blob, key, payload, of)
    except BaseException:
        with contextlib.suppress(OSError):
            sealed.unlink()
        raise
    if not payload.used:  # a retried put whose first attempt stored the batch
        with contextlib.suppress(OSError):
            sealed.unlink()
        return first, count
    # Built before the flush starts (once per open topic; a take builds it too): a reader's ``where`` needs it,
    # and building it waits for a running flush, by which time the file would be gone.
    await topic.field_index()
    # Acknowledged now (the file and its log frame are synced); the flush to the backends follows behind
    # (the flusher calls on_stored, set before the append, once state.json says replay needs the file no more).
    topic.flush_soon()
    return first, count


def _unlinker(path: Path) -> Callable[[], None]:
    def unlink() -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    return unlink


def replayed(wal_dir: Path, ref: dict[str, Any], rows: list[dict[str, Any]], first: int, partition: str) -> Chunk:
    """The chunk of a logged spooled batch, as views on its spool file (a crash before its flush); a file that
    is gone leaves its tensor fields None (logged), like an arena that did not survive."""
    path = spool_dir(wal_dir.parent) / str(ref.get("spool"))
    try:
        fields = check_fields(ref.get("fields"), len(rows), path.stat().st_size if path.exists() else 2**62)
    except ProtocolError as exc:
        raise CorruptionError(f"a log frame's spool reference is malformed: {exc}") from exc
    if not path.exists():
        log.error("the spool file %s of rows %d..%d is gone; their tensor fields read back as None", path, first,
                  first + len(rows) - 1)  # fmt: skip
        return Chunk(first, partition, rows, whole=True)
    payload = ArenaPayload(-next(_payload_ids), dict(ref), columns_of(path, fields, len(rows)))
    payload.on_stored = _unlinker(path)
    # Its rows are encoded per read (``Tail.rows``) or never (a columnar flush takes the views).
    return Chunk(first, partition, rows, arena=payload)


def sweep(topic_path: Path, keep: set[str] | None) -> int:
    """Delete part files whose writer process is gone and, at open (``keep``: the spool files the replayed log
    needs), spool files no log frame needs; ``keep=None`` (a running topic: puts may be sealing) leaves every
    spool file. Returns how many went."""
    directory = spool_dir(topic_path)
    if not directory.is_dir():
        return 0
    gone = 0
    for path in directory.iterdir():
        stem, suffix = path.stem, path.suffix
        match = _NAME.match(stem)
        if suffix == PART_SUFFIX and match and alive(int(match.group(1))):
            continue
        if suffix == SPOOL_SUFFIX and (keep is None or path.name in keep):
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            gone += 1
    return gone


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one counts; one of another user's counts too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def where(topic: Any, indexes: list[int], fields: list[str]) -> dict[str, Any] | None:
    """For a reader on this node: the spool folder of ``topic`` and where the dense ``fields`` of ``indexes``
    lie in its spool files (``Reader.spool_runs``), if all of them still do (else None: read them otherwise).
    The reader opens the files itself; an open file outlives its deletion by the flush, so no hold is needed,
    and the kernel closes it if the reader dies."""
    if not indexes or topic.not_cleared(indexes) != indexes:
        return None  # cleared samples: the usual read says so
    await topic.field_index()  # before spool_runs, which refuses fields written by patches
    runs = topic.spool_runs(indexes, fields)
    if runs is None:
        return None
    return {"dir": str(spool_dir(topic.path)), "runs": [[name, entries] for name, entries in runs]}
