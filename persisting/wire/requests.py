"""The arguments of every request a client sends the broker, one typed struct per operation (msgspec).

The broker decodes a request's ``args`` map straight from its frame into the operation's struct, once: a missing
argument, a value of the wrong type (a ``bool`` is never a number here), a negative index or a negative wait is
refused by that decode, and ``args_error`` words the refusal as the ``ProtocolError`` the client gets. What a
struct cannot say (a value of the right type that is still wrong: ``batch_size`` below 0, a sampler's name) the
handler checks. Arguments a struct does not name are ignored, as they always were: a newer client may send more.

A topic's ``config`` stays msgpack bytes here: a client sends the same config with every request, and the broker
decodes and checks each distinct one once (broker/topics.py).

``REQUESTS`` is the wire's catalogue: every operation's name and its arguments. The broker's request table
(broker/requests/table.py) gives each one its handler and reply; docs/reference/protocol.md is generated from
that table. Replies are typed in replies.py.

Positional shapes are named here: a tensor field of ``put_tensors`` is a ``TensorField`` (six values) or a
``JaggedField`` (eight), a tag of ``set_tags`` a ``TagItem``, a giveback a ``Released`` entry.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ..errors import ProtocolError

Index = Annotated[int, msgspec.Meta(ge=0)]  # a global index, a count of samples, an extent or hold id
Seconds = Annotated[float, msgspec.Meta(ge=0)]  # a wait; an int is taken as a float, a bool is refused
Kinds = dict[str, Any]  # field name -> kind name; the kinds themselves are checked with the rows (row_checks.py)


class Args(msgspec.Struct, kw_only=True):
    """The arguments of a request; a subclass per operation (or per group of operations that take the same)."""


class TopicArgs(Args, kw_only=True):
    """Every topic request names its topic and the settings it is opened with (a broker that restarted opens it
    again on the first request it gets)."""

    topic: str
    config: msgspec.Raw  # a map; decoded and checked once per distinct config (broker/topics.py)


class Released(msgspec.Struct, array_like=True):
    """Arena space a client gives back: the arena's generation, hold ids, ids of leased extents never put."""

    generation: Any
    holds: list[Index]
    extents: list[Index]


class GivebackArgs(Args, kw_only=True):
    """What may ride on an arena or sample request: holds and leases the client gives back (broker/givebacks.py).
    ``release`` and ``abandon`` (with ``generation``) are the older, separate forms of ``released``."""

    released: list[Released] | None = None
    release: list[Index] | None = None
    abandon: list[Index] | None = None
    generation: bytes | None = None


class SampleArgs(GivebackArgs, kw_only=True):
    """A request about the samples of a topic (with givebacks riding along)."""

    topic: str
    config: msgspec.Raw  # a map; decoded and checked once per distinct config (broker/topics.py)


# -- connection and broker ----------------------------------------------------------------------------------------


class Hello(Args, kw_only=True):
    peer: Any = None  # [pid, start time]: listed under it where the kernel does not name the process


class NoArgs(Args, kw_only=True):
    """``status``, ``topics``: no arguments."""


# -- records --------------------------------------------------------------------------------------------------------


class PutBatch(TopicArgs, kw_only=True):
    partition: str
    kinds: Kinds
    count: int
    key: str | None = None  # idempotency: a put re-sent with its key is stored once
    of: list[Index] | None = None  # a patch: the samples whose fields row k writes
    dedup: Any = None  # [bytes put, bytes stored] of deduped fields: the producer's word, shown in status only


class Read(TopicArgs, kw_only=True):
    offset: int
    limit: int
    wait: float | None = None  # seconds; negative counts as zero


class Wait(TopicArgs, kw_only=True):
    index: int
    timeout: float | None = None  # seconds; negative counts as zero, nil the longest slice


class TopicOnly(TopicArgs, kw_only=True):
    """``flush``, ``stats``, ``count``, ``partitions``: the topic alone."""


# -- samples ---------------------------------------------------------------------------------------------------------


class Note(msgspec.Struct, kw_only=True):
    """A take's rider: a record per sample taken, ``{field: its global index, **values}``
    (broker/requests/riders.py)."""

    partition: str
    field: str
    values: dict[str, Any]


class ThenPut(msgspec.Struct, kw_only=True):
    """A mark_consumed's rider: the request's rows buffer appended once the consumption is logged."""

    partition: str
    kinds: Kinds
    count: int
    key: str


class Take(SampleArgs, kw_only=True):
    partition: str
    task: str
    batch_size: int
    wait: Seconds = 0.0
    sampler: Any = None  # a built-in sampler's wire form (the engine's sampler_from_wire checks it)
    sampler_kw: dict[str, Any] | None = None  # dp_rank and batch_index only
    lease_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None  # nil: consumed on fetch
    ready_fields: list[str] | None = None
    fields: list[str] | None = None  # get_batch: the samples' data in the same reply
    describe: bool = True  # false (with fields): a take of one sample leaves its descriptions out
    key: str | None = None
    note: Note | None = None
    peer: Any = None  # [pid, start time]: the lease's holder where the kernel does not name the process
    zerocopy: bool = True
    columns: bool = False


class Indexes(SampleArgs, kw_only=True):
    """``describe``: the samples by global index."""

    indexes: list[Index]


class GetData(SampleArgs, kw_only=True):
    indexes: list[Index]
    fields: list[str]
    zerocopy: bool = True  # false: copies, never views of shared memory
    columns: bool = False  # dense fields as raw frames, one per field (wire/columns.py)
    views_only: bool = False  # views or {"later": true}, never copies (a batch too large for one reply)


class Consumption(SampleArgs, kw_only=True):
    """``reset_consumption``: a task's consumption of a partition."""

    partition: str
    task: str


class GiveBack(Consumption, kw_only=True):
    """``give_back``: leases that end unconsumed (the samples are ready again)."""

    indexes: list[Index]


class MarkConsumed(GiveBack, kw_only=True):
    then_put: ThenPut | None = None


class Clear(SampleArgs, kw_only=True):
    partition: str
    indexes: list[Index] | None = None  # nil: the whole partition


class TagItem(msgspec.Struct, array_like=True):
    index: int
    tags: dict[str, Any]


class SetTags(SampleArgs, kw_only=True):
    partition: str
    items: list[TagItem]


class Partitions(SampleArgs, kw_only=True):
    """``partitions``: the topic alone."""


# -- the arena -------------------------------------------------------------------------------------------------------


class Lease(GivebackArgs, kw_only=True):
    nbytes: int
    timeout: Seconds


class Release(GivebackArgs, kw_only=True):
    hold: int | None = None


class TensorField(msgspec.Struct, array_like=True):
    """A dense tensor field of a put_tensors batch, where the producer wrote it in its extent."""

    name: str
    kind: str
    dtype: str
    shape: list[Index]  # of one sample
    offset: int  # in the extent
    nbytes: int


class JaggedField(msgspec.Struct, array_like=True):
    """A jagged field (tensors/jagged.py): values plus offsets, both in the extent."""

    name: str
    kind: str
    dtype: str
    shape: list[int]  # of one sample, -1 along the ragged dimension
    offset: int
    nbytes: int  # of the values
    offsets_at: int
    total: int  # values along the ragged dimension


TENSOR_FIELD_ITEMS = 6
JAGGED_FIELD_ITEMS = 8


def tensor_field(entry: list[Any]) -> TensorField | JaggedField:
    """A ``put_tensors`` field entry by its shape (six values: dense, eight: jagged), or ProtocolError."""
    if len(entry) not in (TENSOR_FIELD_ITEMS, JAGGED_FIELD_ITEMS):
        raise ProtocolError("each put_tensors field is [name, kind, dtype, shape, offset, nbytes, ...]")
    try:
        if len(entry) == TENSOR_FIELD_ITEMS:
            return msgspec.convert(entry, TensorField)
        return msgspec.convert(entry, JaggedField)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"put_tensors field {entry[0]!r}: {exc}") from exc


class KeyedPut(msgspec.Struct, kw_only=True):
    """A put_tensors with keys (Queue.kv_put through the arena)."""

    keys: list[str]
    tags: list[dict[str, Any]] | None = None


class PutTensors(SampleArgs, kw_only=True):
    partition: str
    count: Index
    kinds: Kinds
    extent: int
    fields: list[list[Any]]  # TensorField or JaggedField each (tensor_field)
    key: str | None = None
    of: list[Index] | None = None
    lease_next: int | None = None  # bytes of the producer's next extent, leased in the reply if free now
    kv: KeyedPut | None = None
    dedup: Any = None


# -- keyed samples ---------------------------------------------------------------------------------------------------


class KvPut(TopicArgs, kw_only=True):
    partition: str
    keys: list[str]
    tags: list[dict[str, Any]] | None = None
    key: str | None = None
    kinds: Kinds | None = None  # with a rows buffer
    count: int | None = None


class KvGet(SampleArgs, kw_only=True):
    partition: str
    keys: list[str]
    fields: list[str] | None = None  # nil: those every key has
    read: bool = False  # the data too, in the same reply
    zerocopy: bool = True
    columns: bool = False


class KvList(TopicArgs, kw_only=True):
    partition: str | None = None  # nil: every one


class KvKeys(TopicArgs, kw_only=True):
    """``kv_clear``: keys of a partition."""

    partition: str
    keys: list[str]


class KvNames(TopicArgs, kw_only=True):
    partition: str
    indexes: list[Index]


# -- batches larger than the arena -----------------------------------------------------------------------------------


class SpoolBegin(TopicArgs, kw_only=True):
    pid: int | None = None  # the writer, where the kernel does not name it


class SpoolWhere(TopicArgs, kw_only=True):
    indexes: list[Index]
    fields: list[str]


class PutSpooled(TopicArgs, kw_only=True):
    partition: str
    count: Annotated[int, msgspec.Meta(ge=1)]
    kinds: Kinds
    name: str
    fields: Any = None  # the spool file's layout (engine/spooled.py checks it)
    key: str | None = None
    of: list[Index] | None = None


REQUESTS: dict[str, type[Args]] = {
    "hello": Hello,
    "status": NoArgs,
    "topics": NoArgs,
    "put_batch": PutBatch,
    "read": Read,
    "wait": Wait,
    "flush": TopicOnly,
    "stats": TopicOnly,
    "count": TopicOnly,
    "take": Take,
    "describe": Indexes,
    "get_data": GetData,
    "mark_consumed": MarkConsumed,
    "give_back": GiveBack,
    "reset_consumption": Consumption,
    "clear": Clear,
    "partitions": Partitions,
    "set_tags": SetTags,
    "lease": Lease,
    "release": Release,
    "put_tensors": PutTensors,
    "kv_put": KvPut,
    "kv_get": KvGet,
    "kv_list": KvList,
    "kv_clear": KvKeys,
    "kv_names": KvNames,
    "spool_begin": SpoolBegin,
    "spool_where": SpoolWhere,
    "put_spooled": PutSpooled,
}


def args_error(op: str, exc: msgspec.ValidationError) -> ProtocolError:
    """The refusal of a request's arguments, naming the argument: ``take wait ... (argument 'wait' of 'take')``."""
    text = str(exc)
    detail, _, where = text.partition(" - at `$.")
    if where:
        name = where.split("`")[0]
    elif "missing required field `" in text:
        name = text.split("`")[1]
    else:
        name = ""
    if not name:
        return ProtocolError(f"operation {op!r}: args must be a map of named arguments ({text})")
    top = name.split("[")[0].split(".")[0]
    return ProtocolError(f"{op} {name}: {detail} (argument {top!r} of operation {op!r})")
