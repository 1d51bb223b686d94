"""The data of samples, as one reply's result: views of shared memory (with a hold), or copies (rows, and dense
fields as raw frames), or ``later`` (too large for one reply). Shared by ``get_data`` (samples.py), a take with
``fields`` (take.py) and ``kv_get`` (kv.py)."""

from __future__ import annotations

from typing import Any

from persisting.engine import Topic
from persisting.errors import ConfigError
from persisting.tensors.arena import Arena, Peer
from persisting.wire import codec, columns
from persisting.wire.replies import Copies, Data, JaggedRunEntry, Later, RunEntry, Views

from ..tensor_memory import TensorMemory

TENSOR_KINDS = frozenset({"ndarray", "tensor", "jagged"})
JAGGED_RUN_ITEMS = 8  # a jagged field's run entry (engine/reader.py jagged_entry); a dense one has 7


async def data(
    memory: TensorMemory,
    topic: Topic,
    peer: Peer | None,
    indexes: list[int],
    fields: list[str],
    *,
    zerocopy: bool = True,
    columns_wanted: bool = False,
    views_only: bool = False,
    checked: bool = False,
) -> tuple[Data, list[bytes]]:
    """The data of ``fields`` of ``indexes`` and the reply's buffers. ``checked``: the samples were just taken or
    looked up (a take, kv_get): no test that they are still there. ``views_only``: views of shared memory or
    ``Later``, never copies (a batch too large for one reply)."""
    arena, extents = memory.arena, memory.extents
    if not checked and (kept := topic.not_cleared(indexes)) != indexes:  # as embedded get_data says it
        gone = sorted(set(indexes) - set(kept))[:10]
        raise ConfigError(f"samples with global indexes {gone} were cleared (clear()); they have no data")
    await topic.field_index()  # before arena_runs, which follows fields written by patches
    # views only for a process the kernel names
    if arena is not None and extents is not None and peer is not None and zerocopy and indexes:
        tensor_fields = [f for f in fields if topic.kinds.get(f) in TENSOR_KINDS]
        runs = topic.arena_runs(indexes, tensor_fields)
        if runs is not None and not tensor_fields:
            runs = None  # nothing to map: no hold (the plain fields come as rows below)
        if runs is not None and not extents.may_hold(peer, [eid for eid, _ in runs]):
            runs = None  # this process pins its share of the arena already: copies (extents.py, the cap)
        if runs is not None:
            # the engine gives extent offsets; the client maps arena offsets
            views = [[_run_entry(entry, arena) for entry in entries] for _, entries in runs]
            # The non-tensor fields of arena batches sit beside the views in the tail: no payload copy.
            plain = [f for f in fields if f not in tensor_fields]
            hold = extents.hold([eid for eid, _ in runs], peer)
            # (the hold keeps the views valid meanwhile); a tensors-only take sends no per-sample rows at all
            others = await topic.plain_values(indexes, plain) if plain else []
            kinds = {f: topic.kinds[f] for f in plain if f in topic.kinds}
            return Views(hold, arena.generation, views, kinds), [codec.pack(others)]
    if views_only:  # a batch too large for one reply of copies: the client reads it otherwise
        return Later(True), []
    if columns_wanted:  # the dense fields as raw frames, one per field (wire/columns.py)
        dense, rows, kinds = await topic.sample_columns(indexes, fields)
        entries, frames = columns.frames(dense)
        return Copies(kinds, entries), [codec.pack(rows), *frames]
    rows, kinds = await topic.sample_rows(indexes, fields)
    return Copies(kinds), [codec.pack(rows)]


def drop_hold(memory: TensorMemory, result: Data, holder: Peer | None) -> None:
    """Give back the hold of a data reply that will not be sent (its views are never made)."""
    if isinstance(result, Views) and memory.extents is not None and holder is not None:
        memory.extents.release(result.hold, holder)


def _run_entry(entry: list[Any], arena: Arena) -> RunEntry | JaggedRunEntry:
    """One field of a run as the reply names it: the engine's memory address made an arena offset."""
    if len(entry) == JAGGED_RUN_ITEMS:
        name, kind, dtype, shape, address, samples, total, offsets = entry
        return JaggedRunEntry(name, kind, dtype, shape, arena.offset_of(address), samples, total, offsets)
    name, kind, dtype, shape, address, samples, sample_bytes = entry
    return RunEntry(name, kind, dtype, shape, arena.offset_of(address), samples, sample_bytes)
