"""Batches larger than the arena, on the producer's and the consumer's side: written and read in pieces.

Put: the tensors of a batch above the size the arena takes (``spool_above``) are written, field after field in
pieces of at most ``PIECE_BYTES``, into a spool file of the topic (``write_part``: ``pwrite`` from the caller's
own memory, the one copy the batch gets) and stored from there (``engine/spooled.py``). Get: a ``get_data`` of
more than that is asked for in runs of samples of at most ``PIECE_BYTES`` each (``piece_ranges``), and each
field's pieces are copied into one result array allocated once (``Gathered``): the one copy a consumer needs.
The next piece is asked for while the last one is copied: at most 2 pieces are in flight, so no request, reply
or buffer anywhere holds more than 2 pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .arena import DEFAULT_ARENA_BYTES, HEADER_BYTES, align_up
from .column import AnyColumn, Column, Parts, storage_dtype, to_user
from .meta import BatchMeta

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it

SPOOL_ABOVE_BYTES = DEFAULT_ARENA_BYTES  # embedded mode (no arena): batches above this go through a spool file
PIECE_BYTES = 64 * 1024 * 1024  # the most one write call or one get_data request of a big batch moves
SPOOL_FIELD_ALIGN_BYTES = 4096  # each field starts on a page: mapping it back gives aligned views


def spool_above(arena_size_bytes: int | None) -> int:
    """The batch size above which a put goes through a spool file: what the arena's data area holds (broker
    mode), else ``SPOOL_ABOVE_BYTES``."""
    if arena_size_bytes:
        return max(arena_size_bytes - HEADER_BYTES, 1)
    return SPOOL_ABOVE_BYTES


def spoolable(columns: Mapping[str, AnyColumn]) -> bool:
    """Dense fields only: jagged ones keep the arena path (or the copy path)."""
    return bool(columns) and all(isinstance(c, Column) for c in columns.values())


def layout(columns: Mapping[str, AnyColumn]) -> tuple[list[list[Any]], int]:
    """``[name, kind, dtype, sample shape, offset, nbytes]`` per field in the spool file, and the file size."""
    fields: list[list[Any]] = []
    cursor = 0
    for name, col in columns.items():
        offset = align_up(cursor, SPOOL_FIELD_ALIGN_BYTES)
        fields.append([name, col.kind, col.dtype_name, list(col.sample_shape), offset, col.nbytes])
        cursor = offset + col.nbytes
    return fields, cursor


def write_part(path: str, columns: Mapping[str, AnyColumn], fields: list[list[Any]]) -> None:
    """Write each field at its offset, ``PIECE_BYTES`` per call, from the caller's memory (no staging copy).
    Not synced here: the engine syncs the file before its log frame names it."""
    fd = os.open(path, os.O_WRONLY)
    try:
        for name, _kind, _dtype, _shape, offset, nbytes in fields:
            col = columns[name]
            if not isinstance(col, Column):
                raise ConfigError(f"field {name!r} is jagged; a spooled batch holds dense fields only")
            flat = np.ascontiguousarray(col.array).reshape(-1).view(np.uint8).data  # a memoryview, no copy
            done = 0
            while done < nbytes:
                done += os.pwrite(fd, flat[done : min(done + PIECE_BYTES, nbytes)], offset + done)
    finally:
        os.close(fd)


def _field_bytes(kind: str, dtype: str, shape: Any) -> int:
    """Bytes of one sample of a tensor field (0 for a value field or an unknown shape or dtype)."""
    if kind not in ("ndarray", "tensor") or not dtype:
        return 0
    try:
        # math.prod, not np.prod: a twentieth of the time on a few dims (the broker sizes every get_batch)
        return int(math.prod(shape)) * storage_dtype(kind, dtype).itemsize
    except (TypeError, ValueError, ConfigError):
        return 0


def sample_bytes(meta: BatchMeta, fields: list[str]) -> list[int]:
    """Bytes of the wanted tensor fields of each sample of ``meta`` (0 where shapes are not known)."""
    out = []
    seen: dict[int, int] = {}  # the samples of one run share one fields mapping: sized once
    for s in meta.samples:
        known = seen.get(id(s.fields))
        if known is not None:
            out.append(known)
            continue
        total = 0
        for name in fields:
            f = s.fields.get(name)
            if f is not None:
                total += _field_bytes(f.kind, f.dtype, f.shape)
        seen[id(s.fields)] = total
        out.append(total)
    return out


def described_bytes(described: list[list[Any]], fields: list[str]) -> int:
    """Bytes of the wanted tensor fields of the samples ``Topic.describe``'s runs cover ([count, {name: [kind,
    dtype, shape]}, ...] each): what ``sum(sample_bytes(meta_from(...)))`` gives, sized per run, without making a
    meta per sample (the broker asks this on every get_batch)."""
    total = 0
    for count, desc, *_rest in described:
        per = 0
        for name in fields:
            d = desc.get(name)
            if d is not None:
                kind, dtype, shape = d
                per += _field_bytes(str(kind), str(dtype), tuple(int(x) for x in shape))
        total += int(count) * per
    return total


def piece_ranges(sizes: list[int], piece_bytes: int) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of samples of at most ``piece_bytes`` each (a sample larger than that alone)."""
    out: list[tuple[int, int]] = []
    a, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > a and acc + size > piece_bytes:
            out.append((a, i))
            a, acc = i, 0
        acc += size
    if a < len(sizes):
        out.append((a, len(sizes)))
    return out


class Gathered:
    """One result per field, filled piece by piece: arrays and tensors into one allocation each (made from the
    first piece's dtype and sample shape), other values into lists. Every array and tensor of a piece is copied
    (the pieces' dense fields may be read-only views of a reply's frames: ``data_api``'s fetch of a piece asks
    for them uncopied, so each byte is copied once, here)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.out: dict[str, Any] = {}

    def add(self, a: int, b: int, piece: Mapping[str, Any]) -> None:
        for name, value in piece.items():
            if isinstance(value, Parts):  # the piece's samples in several arrays: each copied in at its place
                at = a
                for part in value:
                    self.add(at, at + len(part), {name: part})
                    at += len(part)
                continue
            have = self.out.get(name)
            if isinstance(value, np.ndarray) and value.shape[:1] == (b - a,):
                if have is None and a == 0:
                    have = self.out[name] = np.empty((self.n, *value.shape[1:]), dtype=value.dtype)
                if isinstance(have, np.ndarray) and have.shape[1:] == value.shape[1:]:
                    have[a:b] = value
                    continue
            elif _is_torch(value) and value.dim() > 0 and value.shape[0] == b - a:
                import torch

                if have is None and a == 0:
                    have = self.out[name] = torch.empty((self.n, *value.shape[1:]), dtype=value.dtype)
                if isinstance(have, torch.Tensor) and have.shape[1:] == value.shape[1:]:
                    have[a:b].copy_(value)
                    continue
            # lists (values, samples of differing shapes): per sample, in order; a piece's samples copied (its
            # arrays may be views of a reply's frames, which fetch hands over uncopied: see Batch pieces)
            items = [_own(v) for v in value] if not isinstance(value, list) else value
            if have is None:
                self.out[name] = list(items)
            elif isinstance(have, list):
                have.extend(items)
            else:  # an array so far, then shapes changed: fall back to a list of samples
                self.out[name] = [*list(have[:a]), *items]


def _own(value: Any) -> Any:
    """A sample of a piece as the caller's own (a copy of an array or tensor)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    return value.clone() if _is_torch(value) else value


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "dim")


async def gather(
    meta: BatchMeta, fields: list[str], most: int, fetch: Callable[[BatchMeta], Awaitable[Any]]
) -> dict[str, Any] | None:
    """The data of ``meta`` if its tensors exceed ``most`` bytes: ``fetch`` asked for runs of samples of at most
    ``min(PIECE_BYTES, most / 2)`` bytes, gathered into one result per field; None if it is not that large."""
    sizes = sample_bytes(meta, fields)
    if meta.size <= 1 or sum(sizes) <= most:
        return None
    out = Gathered(meta.size)
    ranges = piece_ranges(sizes, min(PIECE_BYTES, max(most // 2, 1)))

    def ask(k: int) -> asyncio.Future[Any]:
        a, b = ranges[k]
        return asyncio.ensure_future(fetch(BatchMeta(meta.samples[a:b], meta.extra_info)))

    # Piece k+1 is asked for before piece k is copied, so the broker reads the next piece while this process
    # copies the last one: at most 2 pieces in flight (the one being copied and the one asked for).
    ahead = ask(0)
    try:
        for k, (a, b) in enumerate(ranges):
            data = await ahead
            if k + 1 < len(ranges):
                ahead = ask(k + 1)
            out.add(a, b, data)
            release = getattr(data, "release", None)
            if release is not None:
                release()  # copied: its views (if any) go back now, not when collected
            del data, release
            # The piece's reply buffers sit in reference cycles of the request machinery (futures, frames):
            # without this, a 2 GiB read left ~0.9x its size of dead pieces in RSS until a full collection came.
            gc.collect(1)
    finally:
        if not ahead.done():
            ahead.cancel()  # this get failed or was cancelled: the piece asked ahead is not wanted
            with contextlib.suppress(BaseException):
                await ahead
        elif not ahead.cancelled():
            ahead.exception()  # (looked at: a failed piece asked ahead is not logged as an error nobody saw)
    return out.out


def read_spooled(where: Mapping[str, Any], n: int) -> dict[str, tuple[np.ndarray, str, str]] | None:
    """The dense fields of ``n`` samples read straight from the spool files that hold them (``where``: the
    engine's ``spool_where``), one ``pread`` per run and piece into one result array per field: the one copy a
    consumer needs, from the page cache. Every file is opened before any byte is read: an open file stays
    readable when the flush deletes it (that is the hold; the kernel drops it if this process dies). None if a
    file is gone already (flushed: read it otherwise). Returns (array, kind, dtype name) per field."""
    directory = str(where["dir"])
    runs = where["runs"]
    fds: dict[str, int] = {}
    try:
        for name, _entries in runs:
            if name not in fds:
                if not isinstance(name, str) or "/" in name or name.startswith("."):
                    raise ConfigError(f"spool file name {str(name)[:80]!r} is not a plain file name")
                try:
                    fds[name] = os.open(os.path.join(directory, name), os.O_RDONLY)
                except FileNotFoundError:
                    return None
        out: dict[str, tuple[np.ndarray, str, str]] = {}
        at: dict[str, int] = {}
        for name, entries in runs:
            for field, kind, dtype_name, shape, offset, count, per in entries:
                if field not in out:
                    out[field] = (np.empty((n, *shape), dtype=storage_dtype(kind, dtype_name)), kind, dtype_name)
                    at[field] = 0
                arr = out[field][0]
                a = at[field]
                if arr.shape[1:] != tuple(shape) or a + count > n or per != arr[0].nbytes:
                    raise ConfigError(f"spooled field {field!r} changes shape inside one get; read it in parts")
                _pread_into(fds[name], arr[a : a + count].reshape(-1).view(np.uint8), offset)
                at[field] = a + count
        return out
    finally:
        for fd in fds.values():
            os.close(fd)


def _pread_into(fd: int, dest: np.ndarray, offset: int) -> None:
    """Fill ``dest`` (bytes) from ``fd`` at ``offset``, ``PIECE_BYTES`` per call (one copy, no staging)."""
    view = memoryview(dest)  # type: ignore[arg-type]
    done, total = 0, len(view)
    while done < total:
        got = os.preadv(fd, [view[done : min(done + PIECE_BYTES, total)]], offset + done)
        if got <= 0:
            raise ConfigError(f"a spool file ended {total - done} bytes early (truncated by hand?)")
        done += got


async def from_spool(
    meta: BatchMeta,
    fields: list[str],
    most: int,
    where: Callable[[list[int], list[str]], Awaitable[Any]],
    fetch: Callable[[BatchMeta], Awaitable[Any]],
    device: Any,
) -> dict[str, Any] | None:
    """The data of ``meta`` if its dense fields exceed ``most`` bytes and all lie in spool files still there:
    ``where`` (the engine's ``spool_where``, or the broker's) says where, ``read_spooled`` reads them (one copy),
    ``fetch`` gets the other fields; None otherwise (read it in pieces: ``gather``)."""
    first = meta.samples[0].fields if meta.samples else {}
    dense = [f for f in fields if f in first and first[f].kind in ("ndarray", "tensor")]
    if meta.size <= 1 or not dense or sum(sample_bytes(meta, dense)) <= most:
        return None
    found = await where(meta.global_indexes, dense)
    if not found:
        return None
    read = await asyncio.to_thread(read_spooled, found, meta.size)
    if read is None:
        return None  # flushed meanwhile (the file is gone): from the backends
    plain = [f for f in fields if f not in read]
    others = {k: _own(v) for k, v in (await fetch(meta.select_fields(plain))).items()} if plain else {}
    out: dict[str, Any] = {}
    for name in fields:
        if name in read:
            arr, kind, dtype_name = read[name]
            out[name] = to_user(arr, kind, dtype_name, device)
        elif name in others:
            out[name] = others[name]
    return out
