"""The results of the broker's replies, typed (msgspec): what a handler answers is one of these (or a plain value:
a bool, an int, a map the engine makes), and the envelope encodes it as the same msgpack the clients read.

Positional replies are ``array_like`` structs: each position has a name here, and a reply whose length differs by
case (a put that leased the producer's next extent, a take with a ``note``) is a struct per case, never a list
padded with nils. Map replies encode as maps with these keys (a default left out where the struct says so).
Requests and their arguments: requests.py.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Range(msgspec.Struct, array_like=True):
    """Samples a put stored: [first global index, count]."""

    first: int
    count: int


class Extent(msgspec.Struct, array_like=True):
    """An extent leased to a producer: [extent id, arena offset, extent bytes, arena generation]."""

    id: int
    offset: int
    nbytes: int
    generation: bytes


class RangeLeased(msgspec.Struct, array_like=True):
    """A put_tensors that also leased the producer's next extent (``lease_next``): [first, count, extent]."""

    first: int
    count: int
    next_extent: Extent


class KeyedRange(msgspec.Struct, array_like=True):
    """kv_put: [first, count, [sample per key], descriptions of those samples]."""

    first: int
    count: int
    samples: list[int]
    described: list[Any]


class KeyedTensorRange(msgspec.Struct, array_like=True):
    """put_tensors with kv: [first, count, next extent or nil, [sample per key], descriptions of those samples]."""

    first: int
    count: int
    next_extent: Extent | None
    samples: list[int]
    described: list[Any]


class Read(msgspec.Struct):
    """A page of records: their kinds, the topic's count, whether a ``wait`` was honoured, where the next read
    starts (rows of cleared samples are skipped); the rows come as the reply's buffer."""

    kinds: dict[str, Any]
    count: int
    waited: bool
    end: int


class RunEntry(msgspec.Struct, array_like=True):
    """Where one field of a run of samples lies in the arena: [field, kind, dtype, sample shape, arena offset of the
    run's first sample, samples, bytes per sample]."""

    field: str
    kind: str
    dtype: str
    shape: list[int]
    offset: int
    samples: int
    sample_bytes: int


class JaggedRunEntry(msgspec.Struct, array_like=True):
    """A jagged field of a run: [field, "jagged", dtype, sample shape, arena offset of the values, samples, values
    along the ragged dimension from there, offsets (samples + 1 int64, into those values)]."""

    field: str
    kind: str
    dtype: str
    shape: list[int]
    offset: int
    samples: int
    total: int
    offsets: bytes


class Views(msgspec.Struct):
    """Data as views of shared memory: a hold keeps them valid until released; plain fields come as rows in the
    reply's buffer."""

    hold: int
    generation: bytes
    runs: list[list[RunEntry | JaggedRunEntry]]
    kinds: dict[str, Any]


class Later(msgspec.Struct):
    """Too large for one reply of copies: the client reads the data in pieces (``{"later": true}``)."""

    later: bool


class Copies(msgspec.Struct, omit_defaults=True):
    """Data as copies: rows in the reply's first buffer; with ``columns``, one raw frame per dense field after it
    (wire/columns.py)."""

    kinds: dict[str, Any]
    columns: list[Any] | None = None


Data = Views | Later | Copies


class Taken(msgspec.Struct, array_like=True):
    """A take (get_meta): [global indexes, field descriptions]."""

    indexes: list[int]
    described: list[Any]


class TakenNoted(msgspec.Struct, array_like=True):
    """A take with a ``note``: [indexes, descriptions, the note's records ([first, count]) or nil if none]."""

    indexes: list[int]
    described: list[Any]
    noted: Range | None


class TakenWithData(msgspec.Struct, array_like=True):
    """A take with ``fields`` (get_batch): [indexes, descriptions, data]."""

    indexes: list[int]
    described: list[Any]
    data: Data


class TakenWithDataNoted(msgspec.Struct, array_like=True):
    """A get_batch with a ``note``: [indexes, descriptions, data, the note's records or nil]."""

    indexes: list[int]
    described: list[Any]
    data: Data
    noted: Range | None


class KeyedSamples(msgspec.Struct, array_like=True):
    """kv_get: [sample or nil per key, descriptions of the found ones, fields read, data or nil]."""

    samples: list[int | None]
    described: list[Any]
    fields: list[str]
    data: Data | None


class SpoolPart(msgspec.Struct, array_like=True):
    """spool_begin: [part name, path of a fresh part file the caller writes]."""

    name: str
    path: str
