"""Tensor batches larger than the arena, on a ``Queue``: put through a spool file, got in pieces.

Composed into ``tensor_puts.TensorPuts`` (``put``) and ``data_api`` (``get``); the file format and the piece
arithmetic live in ``tensors/pieces.py``, the engine's side in ``engine/spooled.py``. The path each size takes is
written in docs/concepts/batch-sizes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tensors import batches, pieces
from ..tensors.column import AnyColumn
from ..tensors.meta import BatchMeta
from ..wire import codec

if TYPE_CHECKING:
    from .topic_api import TopicAPI


async def limit(topic: TopicAPI) -> int:
    """Bytes above which a batch is read back in pieces (or from its spool file), unless its samples lie in the
    broker's shared memory (then views): what one reply may copy."""
    arena = topic.arena
    size = await arena.arena_bytes() if arena is not None else None
    return pieces.spool_above(size)


async def put_limit(topic: TopicAPI) -> int:
    """Bytes above which a batch is put through a spool file: the most the broker's shared memory takes in one
    piece (its budget), or, without shared memory (embedded), ``pieces.SPOOL_ABOVE_BYTES``."""
    arena = topic.arena
    largest = await arena.arena_bytes("largest_batch_bytes") if arena is not None else None
    return largest or await limit(topic)


async def above_limit(topic: TopicAPI, columns: Mapping[str, AnyColumn]) -> bool:
    """Whether a batch goes through a spool file for its size: dense fields only, larger than ``put_limit``."""
    return pieces.spoolable(columns) and sum(c.nbytes for c in columns.values()) > await put_limit(topic)


async def spool(
    topic: TopicAPI,
    columns: Mapping[str, AnyColumn],
    other: dict[str, list[Any]],
    n: int,
    partition: str,
    patch: BatchMeta | None,
    key: str | None,
) -> BatchMeta:
    """Store a batch through a spool file, whatever its size (one ``above_limit``, or a put that found the
    shared-memory budget full: memory pressure spills it to disk)."""
    plain = batches.other_rows(other, n, topic.kinds)
    blob = codec.pack(plain.rows)
    fields, _size = pieces.layout(columns)
    of = None if patch is None else patch.global_indexes
    key = key or uuid.uuid4().hex  # retried requests store the batch once
    name, path = await topic.spool_begin()
    try:
        await asyncio.to_thread(pieces.write_part, path, columns, fields)
        first, count = await topic.put_spooled(plain, partition, blob, key, name, fields, of)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(path).unlink()  # the engine took it (and deletes it itself), or it is swept; this is early cleanup
        raise
    return batches.batch_meta(first, count, partition, columns, other, patch)


async def get(
    meta: BatchMeta,
    fields: list[str],
    topic: TopicAPI,
    fetch: Callable[[BatchMeta], Awaitable[Any]],
    device: Any = None,
    mode: str = "auto",
    moved: Callable[[str, int], None] | None = None,
) -> batches.Batch | None:
    """The data of a ``meta`` larger than ``limit``: as views where its samples lie in the broker's shared memory,
    else read from its spool files or asked for in pieces and gathered into one result per field; None if it is
    not that large (the caller reads it in one request). ``moved(key, bytes)`` counts what the shared-memory
    answer brought as views and as copies (samples of several extents are joined: a copy); pieces count themselves
    through ``fetch``."""
    # (once per get, the usual small one included: the size is summed here only, not again below)
    if meta.size <= 1 or sum(pieces.sample_bytes(meta, fields)) <= await limit(topic):
        return None
    if mode != "off":  # (no shared memory, as embedded: an empty batch at once)
        viewed, zero, copied = await topic.get_data(meta.global_indexes, fields, mode, device, views_only=True)
        if len(viewed):  # else: not (all) in shared memory
            if moved is not None:
                moved("get_zero_copy_bytes", zero)
                moved("get_copied_bytes", copied)
            return viewed
    direct = await _from_spool(meta, fields, topic, fetch, device)
    if direct is not None:
        return direct
    found = await pieces.gather(meta, fields, await limit(topic), fetch)
    return None if found is None else batches.Batch(found)


async def _from_spool(
    meta: BatchMeta,
    fields: list[str],
    topic: TopicAPI,
    fetch: Callable[[BatchMeta], Awaitable[Any]],
    device: Any,
) -> batches.Batch | None:
    """A spooled batch's dense fields read from its files (``pieces.from_spool``); None if they are not all in
    spool files still there (or this is a tcp client): then the pieces path."""
    found = await pieces.from_spool(meta, fields, await limit(topic), topic.spool_where, fetch, device)
    return None if found is None else batches.Batch(found)
