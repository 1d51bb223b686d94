"""Records that ride on a sample request, appended in its round trip: what a caller would put right after it.

- a ``take``'s ``note``, {partition, field, values}: one record per sample taken, ``{field: its global index,
  **values}``, appended before the reply (whose last element is then [first global index, count], or nil when
  nothing was taken). The persist-queue layer's record that an item is held unacknowledged.
- a ``mark_consumed``'s ``then_put``, {partition, kinds, count, key} with the rows as the request's one buffer: a
  put_batch appended once the consumption is logged (the reply: [first global index, count] instead of nil). The
  persist-queue layer's record that an item is acked.

Both are checked before the request does anything, and are keyed as a put is (the take's key with ``:note``;
``then_put``'s own), so a re-sent request stores its records once.
"""

from __future__ import annotations

from typing import Any

from persisting.engine import Topic
from persisting.errors import ProtocolError
from persisting.wire import codec
from persisting.wire.protocol import Request

from . import records

NOTE_SUFFIX = ":note"


def note_of(req: Request) -> tuple[str, str, dict[str, Any]] | None:
    """A take's ``note`` as (partition, field, values), checked; None without one."""
    note = req.args.get("note")
    if note is None:
        return None
    partition, field, values = (
        (note.get(k) for k in ("partition", "field", "values")) if type(note) is dict else [0] * 3
    )
    if type(partition) is not str or type(field) is not str or type(values) is not dict or field in values:
        raise ProtocolError("take note must be {partition: str, field: str, values: dict without field}")
    return partition, field, values


async def write_note(
    req: Request, topic: Topic, note: tuple[str, str, dict[str, Any]], indexes: list[int]
) -> list[int] | None:
    """Append the note's records of ``indexes`` (the samples the take hands out); [first, count], None if none."""
    if not indexes:
        return None
    partition, field, values = note
    batch = codec.encode_batch([{field: i, **values} for i in indexes], topic.kinds)
    key = req.args.get("key")
    first, n = await topic.append(batch, partition, codec.pack(batch.rows), None if key is None else key + NOTE_SUFFIX)
    return [first, n]


def then_put_of(req: Request) -> tuple[str, codec.EncodedBatch, str] | None:
    """A ``mark_consumed``'s ``then_put`` as (partition, its rows, key), checked; None without one."""
    spec = req.args.get("then_put")
    if spec is None:
        return None
    keys = ("partition", "kinds", "count", "key")
    partition, kinds, count, key = (spec.get(k) for k in keys) if type(spec) is dict else [0] * 4
    if type(partition) is not str or type(kinds) is not dict or type(count) is not int or type(key) is not str:
        raise ProtocolError(f"{req.op} then_put must be {{partition: str, kinds: dict, count: int, key: str}}")
    return partition, records.encoded_rows(req, kinds, count, key, f"{req.op} then_put"), key


async def write_then_put(req: Request, topic: Topic, put: tuple[str, codec.EncodedBatch, str]) -> list[int]:
    partition, batch, key = put
    first, n = await topic.append(batch, partition, req.buffers[0], key)
    return [first, n]
