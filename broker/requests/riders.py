"""Records that ride on a sample request, appended in its round trip: what a caller would put right after it.

- a ``take``'s ``note``, {partition, field, values}: one record per sample taken, ``{field: its global index,
  **values}``, appended before the reply (whose last element is then [first global index, count], or nil when
  nothing was taken). The persist-queue layer's record that an item is held unacknowledged.
- a ``mark_consumed``'s ``then_put``, {partition, kinds, count, key} with the rows as the request's one buffer: a
  put_batch appended once the consumption is logged (the reply: [first global index, count] instead of nil). The
  persist-queue layer's record that an item is acked.

Both are checked before the request does anything (their shapes by the request's struct, wire/requests.py), and
are keyed as a put is (the take's key with ``:note``; ``then_put``'s own), so a re-sent request stores its records
once.
"""

from __future__ import annotations

from persisting.engine import Topic
from persisting.errors import ProtocolError
from persisting.wire import codec
from persisting.wire.replies import Range
from persisting.wire.requests import Note, ThenPut

from .records import encoded_rows

NOTE_SUFFIX = ":note"
Noted = Note  # a note checked by note_of


def note_of(note: Note | None) -> Noted | None:
    """A take's ``note``, checked (its field may not be one of its values); None without one."""
    if note is not None and note.field in note.values:
        raise ProtocolError("take note must be {partition: str, field: str, values: dict without field}")
    return note


async def write_note(key: str | None, topic: Topic, note: Noted, indexes: list[int]) -> Range | None:
    """Append the note's records of ``indexes`` (the samples the take hands out); where they went, None if none."""
    if not indexes:
        return None
    batch = codec.encode_batch([{note.field: i, **note.values} for i in indexes], topic.kinds)
    first, n = await topic.append(
        batch, note.partition, codec.pack(batch.rows), None if key is None else key + NOTE_SUFFIX
    )
    return Range(first, n)


def then_put_rows(op: str, spec: ThenPut, buffers: list[bytes]) -> codec.EncodedBatch:
    """A ``mark_consumed``'s ``then_put`` rows (the request's one buffer), checked against its kinds and count."""
    return encoded_rows(buffers, spec.kinds, spec.count, f"{op} then_put")


async def write_then_put(topic: Topic, spec: ThenPut, batch: codec.EncodedBatch, blob: bytes) -> Range:
    first, n = await topic.append(batch, spec.partition, blob, spec.key)
    return Range(first, n)
