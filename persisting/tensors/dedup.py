"""Content dedup of tensor batches: identical values stored once, every sample that carries one gets a view of it.

Where it applies: a ``Queue(..., dedup=...)`` names the fields (``True``: every dense tensor field and every
``object`` field) whose equal values a put stores once. A GRPO group of n responses to one prompt carries the
prompt's ``pixel_values`` n times: put as one batch of n x prompts samples, the image is stored (in the arena,
in the write-ahead log and in Lance) once per prompt, not once per sample.

Layout (a payload table plus references, readable with plain pyarrow/lance, docs/concepts/dedup.md): each
distinct value is one row of the topic in the partition ``payload_partition(p)``, under the field's own name,
as a typed tensor like any other; each sample of ``p`` holds, in the field ``<name>@payload``, the global index of
its value's row. ``get_data`` resolves the references: a sample's value is a view of the one copy (zero-copy in
broker mode, copy-on-write as every arena view), so where samples repeat a value the field comes back as a list
of per-sample views (where none repeats: the one stacked array, as without dedup).

Identity is established in the producer, before anything is written: a repeated value is never copied into the
arena. Hash: xxh3-128 (the ``xxhash`` package) over the sample's bytes, keyed with its kind, dtype and shape;
11-14 GB/s on one core of this kind of machine, 2-3x the speed of memcpy of the same bytes. xxh3 is not a
cryptographic hash, and the 128-bit hash alone decides by default: an accidental match of two different values
is ~2^-128 per pair (far below the rate of undetected memory errors); a deliberate one needs a producer that
crafts xxh3 collisions, and since the content index and the payload rows are per producer and partition, such
a producer can only spoil its own samples, which it can do anyway by putting other bytes. Comparing the bytes
of every repeat would read them a second time (``memcmp``, ~6 GB/s), more than doubling the cost;
``PERSISTING_DEDUP_VERIFY=1`` turns it on (within a put: later puts no longer hold the first copy here).

Across puts: each producer ``Queue`` keeps a bounded index (``ContentIndex``: partition -> hash -> payload row),
so a value put again into the same partition is referenced, not stored again. Two producer processes do not share
an index: each stores its own first copy.

Lifetime (engine/payloads.py, docs/concepts/dedup.md "Lifetime"): a payload row lives exactly as long as a live
sample references it. The engine counts the references and clears a payload row with the last sample naming it
(and, on a clear of the whole partition, the rows nothing names yet); Lance loses it at the next purge. The index
here may then name a cleared row: the engine refuses a put that references one (``PayloadClearedError``, with
the rows), and ``TensorPuts`` drops those entries and stores the values again (``PUT_ATTEMPTS``). In the arena, a
payload's extent is kept while any consumer holds a view of it and, as every flushed extent, reused afterwards
(reads then come from Lance).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import itertools
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

from ..errors import ConfigError
from ..wire.codec import REF_SUFFIX, RESERVED_PREFIX
from . import jagged, objects
from .column import AnyColumn, Column

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it

REF_KIND = "int"  # a reference is the global index of its payload row (wire/codec.py kind of a Python int)
PAYLOAD_PARTITION_PREFIX = RESERVED_PREFIX + "payloads:"
# Compare the bytes of samples of one put whose hashes match (PERSISTING_DEDUP_VERIFY=1): off by default, see
# the module docstring for why the 128-bit hash alone is enough here; on, it reads the repeats a second time.
VERIFY = os.environ.get("PERSISTING_DEDUP_VERIFY", "0") == "1"
MIN_SAMPLE_BYTES = 4096  # smaller values cost more as references (an int per sample, a lookup) than they save
AUTO = "auto"
Mode = bool | frozenset[str] | str  # str: AUTO only
INDEX_ENTRIES = 65536  # distinct values remembered per producer Queue for dedup across puts (LRU)
# Tries of a deduped put whose samples the engine refuses because a value they reference was cleared meanwhile
# (each try stores the values again; only a clear of that partition racing every try exhausts them).
PUT_ATTEMPTS = 8


def payload_partition(partition: str) -> str:
    """Where the distinct values of ``partition`` are stored (one row each)."""
    return PAYLOAD_PARTITION_PREFIX + partition


def ref_field(name: str) -> str:
    return name + REF_SUFFIX


def check_mode(dedup: Any) -> Mode:
    """``Queue(dedup=...)``: False (off), True (every dense tensor and object field), "auto" (decided per field at
    its first put, see ``chosen``) or field names."""
    if isinstance(dedup, bool):
        return dedup
    if dedup == AUTO:
        return AUTO
    if isinstance(dedup, list | tuple | set | frozenset) and all(isinstance(f, str) and f for f in dedup):
        return frozenset(dedup)
    raise ConfigError(f"dedup must be True, False, 'auto' or a list of field names, got {dedup!r}")


def payload_key(key: str, name: str, attempt: int = 0) -> str:
    """The idempotency key of the payload put of field ``name`` of the put keyed ``key`` (a retried put stores its
    payloads once too); ``attempt``: the put's how-many-th try after its samples were refused for referencing a
    cleared value (``PayloadClearedError``). A digest, so that it stays short whatever the length of ``key``."""
    again = f"\x00{attempt}" if attempt else ""
    return "payload-" + xxhash.xxh3_128_hexdigest(f"{key}\x00{name}{again}".encode())


def digest(sample: Any) -> bytes:
    """xxh3-128 of a sample's bytes (a C-contiguous array or bytes)."""
    return xxhash.xxh3_128_digest(sample)


def _memcmp() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    fn = libc.memcmp
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return fn


_MEMCMP = _memcmp()


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous samples hold the same bytes: libc's memcmp (numpy's array_equal and memoryview
    comparison run at ~0.4 GB/s, memcmp at several GB/s)."""
    return a.nbytes == b.nbytes and _MEMCMP(a.ctypes.data, b.ctypes.data, a.nbytes) == 0


@dataclass(slots=True)
class Distinct:
    """One field's samples by content: ``first`` (sample positions of the distinct values, in order) and
    ``inverse`` (for each sample, its value's place in ``first``); ``keys`` identify the values across puts."""

    first: list[int]
    inverse: list[int]
    keys: list[tuple[Any, ...]]


def _rows(col: AnyColumn) -> list[np.ndarray] | np.ndarray:
    """Each sample's bytes, C-contiguous (a view, except the samples of a jagged column ragged past dim 0)."""
    if isinstance(col, Column):
        return col.array.reshape(col.count, -1) if col.count else col.array
    return [np.ascontiguousarray(col.sample(i)) for i in range(col.count)]


def _values_bytes(col: AnyColumn) -> int:
    return int(col.array.nbytes) if isinstance(col, Column) else int(col.values.nbytes)


def distinct_column(col: AnyColumn, verify: bool | None = None) -> Distinct:
    """The distinct samples of a tensor column (dense, or jagged: keyed with each sample's own shape) by their
    xxh3-128; ``verify`` (default: ``VERIFY``) also compares the bytes of samples whose hashes match, and keeps
    apart those that differ."""
    verify = VERIFY if verify is None else verify
    rows = _rows(col)
    dense = isinstance(col, Column)
    seen: dict[tuple[Any, ...], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    keys: list[tuple[Any, ...]] = []
    for i in range(col.count):
        shape = col.sample_shape if dense else rows[i].shape
        key: tuple[Any, ...] = (col.kind, col.dtype_name, shape, digest(rows[i]))
        at = seen.get(key)
        while verify and at is not None and not same_bytes(rows[first[at]], rows[i]):
            key = (*key, "collision")  # equal hashes, different bytes: a value of its own
            at = seen.get(key)
        if at is None:
            at = seen[key] = len(first)
            first.append(i)
            keys.append(key)
        inverse.append(at)
    return Distinct(first, inverse, keys)


def distinct_objects(values: list[Any]) -> Distinct:
    """The distinct values of an ``object`` field (pickled): equal pickles are one value."""
    seen: dict[tuple[Any, ...], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    keys: list[tuple[Any, ...]] = []
    for i, value in enumerate(values):
        data = value.data if isinstance(value, objects.Pickled) else None
        if data is None:  # None (no value) or not pickled: not deduped, a value of its own
            key: tuple[Any, ...] = ("unique", i)
        else:
            key = (objects.KIND, digest(data))
            at = seen.get(key)
            while at is not None and values[first[at]].data != data:
                key = (*key, "collision")
                at = seen.get(key)
        at = seen.get(key)
        if at is None:
            at = seen[key] = len(first)
            first.append(i)
            keys.append(key)
        inverse.append(at)
    return Distinct(first, inverse, keys)


class ContentIndex:
    """A producer's memory of the values it stored: (partition, field, key) -> payload row, least recently used
    first out. Owned by one ``Queue``'s tensor puts."""

    def __init__(self, entries: int = INDEX_ENTRIES) -> None:
        self._rows: collections.OrderedDict[tuple[Any, ...], int] = collections.OrderedDict()
        self._entries = entries

    def get(self, partition: str, name: str, key: tuple[Any, ...]) -> int | None:
        k = (partition, name, key)
        row = self._rows.get(k)
        if row is not None:
            self._rows.move_to_end(k)
        return row

    def add(self, partition: str, name: str, key: tuple[Any, ...], row: int) -> None:
        if key[0] == "unique":
            return
        self._rows[(partition, name, key)] = row
        self._rows.move_to_end((partition, name, key))
        while len(self._rows) > self._entries:
            self._rows.popitem(last=False)

    def drop(self, partition: str, entries: list[tuple[str, tuple[Any, ...]]], rows: list[int]) -> None:
        """Forget those ``(field, key)`` entries of ``partition`` whose row is among ``rows`` (cleared: a put
        that referenced them was refused); all of them if ``rows`` is empty (not known)."""
        gone = set(rows)
        for name, key in entries:
            k = (partition, name, key)
            if not gone or self._rows.get(k) in gone:
                self._rows.pop(k, None)

    def forget(self, partition: str | None = None) -> None:
        """After a clear: its payload rows may be gone."""
        if partition is None:
            self._rows.clear()
            return
        for k in [k for k in self._rows if k[0] == partition]:
            del self._rows[k]


def _take_column(col: AnyColumn, positions: list[int]) -> AnyColumn:
    """The samples at ``positions`` as a column of their own (jagged: a copy of those samples)."""
    if isinstance(col, Column):
        return Column(col.kind, col.dtype_name, _take(col.array, positions))
    part = jagged.assemble([col.sample(i) for i in positions], col.dtype_name, col.ragged_dim)
    if part is None:  # cannot be: the samples of one jagged column share their other dimensions
        raise ConfigError("the samples of a jagged column do not share their other dimensions")
    return part


def _take(array: np.ndarray, positions: list[int]) -> np.ndarray:
    """``array[positions]``, as a view where the positions are evenly spaced (a GRPO group's first samples)."""
    if len(positions) == 1:
        return array[positions[0] : positions[0] + 1]
    step = positions[1] - positions[0]
    if step > 0 and all(b - a == step for a, b in itertools.pairwise(positions)):
        return array[positions[0] : positions[-1] + 1 : step]
    return array[positions]


PutPayload = Callable[[str, AnyColumn | list[Any], int], Awaitable[int]]
"""Store ``count`` distinct values of one field (a Column, or object values) as payload rows: their first index."""


@dataclass(slots=True)
class Plan:
    """What a deduped put stores: the columns and fields left for the samples' rows, and the byte counts."""

    columns: dict[str, AnyColumn]
    other: dict[str, list[Any]]
    put_bytes: int = 0  # bytes of the deduped fields as put
    stored_bytes: int = 0  # bytes of them stored (new payloads)
    reused: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)  # (field, key) found in the index


def chosen(
    mode: Mode, columns: Mapping[str, AnyColumn], other: Mapping[str, list[Any]], kinds: Mapping[str, str] | None = None
) -> list[str]:
    """The fields of a put that dedup applies to (``kinds``: the fields the topic stores, for ``"auto"``)."""
    if mode is False:
        return []
    if mode == AUTO:
        return _auto(columns, other, kinds or {})
    names = []
    for name, col in columns.items():
        # True: dense fields of big samples; a named field: dense or jagged, whatever its size
        if (isinstance(col, Column) if mode is True else name in mode) and col.count:
            per = _values_bytes(col) // col.count
            if per >= MIN_SAMPLE_BYTES or (mode is not True and per > 0):
                names.append(name)
    for name, values in other.items():
        if (mode is True or name in mode) and any(isinstance(v, objects.Pickled) for v in values):
            names.append(name)
    return names


def stored_deduped(name: str, kinds: Mapping[str, str]) -> bool | None:
    """How the topic stores field ``name`` already: deduped (True), plain (False), not at all yet (None)."""
    if ref_field(name) in kinds:  # (checked first: a deduped field's payload rows hold its own name too)
        return True
    return False if name in kinds else None


def undecided(columns: Mapping[str, AnyColumn], other: Mapping[str, list[Any]], kinds: Mapping[str, str]) -> list[str]:
    """The fields of a put that ``"auto"`` has no decision on in ``kinds`` (this process's view of the topic):
    another process may have decided them since, so the topic's fields are looked up first, once per new field.
    (A field decided by its values here while another process decided it otherwise would be stored both ways.)"""
    pickled = [n for n, values in other.items() if any(isinstance(v, objects.Pickled) for v in values)]
    return [n for n in (*columns, *pickled) if stored_deduped(n, kinds) is None]


def _auto(columns: Mapping[str, AnyColumn], other: Mapping[str, list[Any]], kinds: Mapping[str, str]) -> list[str]:
    """``dedup="auto"``: a field is decided at its first put into the topic and keeps that decision (the topic
    stores it deduped or plain, so a field never holds both): an ``object`` field whose pickles are big (>=
    ``MIN_SAMPLE_BYTES`` each, on average: an image, a ``multi_modal_inputs`` dict), a tensor field (dense or
    jagged) whose samples are big and repeat in that put (a GRPO group's prompt images; not a response's token
    ids, log probs, masks: distinct per sample, where references would only add rows)."""
    names = []
    for name, col in columns.items():
        decided = stored_deduped(name, kinds)
        if decided is None and col.count and _values_bytes(col) // col.count >= MIN_SAMPLE_BYTES:
            decided = len(distinct_column(col).first) < col.count
        if decided and col.count:
            names.append(name)
    for name, values in other.items():
        sizes = [len(v.data) for v in values if isinstance(v, objects.Pickled)]
        decided = stored_deduped(name, kinds)
        if decided is None and sizes:
            decided = sum(sizes) // len(sizes) >= MIN_SAMPLE_BYTES
        if decided:
            names.append(name)
    return names


async def plan(
    names: list[str],
    columns: Mapping[str, AnyColumn],
    other: Mapping[str, list[Any]],
    partition: str,
    index: ContentIndex,
    put_payload: PutPayload,
) -> Plan:
    """Store the new distinct values of the ``names`` fields (``put_payload``) and replace each such field by its
    references. Payloads are stored before the samples that reference them, so a crash between the two leaves
    at most unreferenced payload rows, never a reference to nothing."""
    out = Plan(dict(columns), dict(other))
    for name in names:
        col = out.columns.pop(name, None)
        values = out.other.pop(name, None) if col is None else None
        if col is not None:
            d = distinct_column(col)
            out.put_bytes += _values_bytes(col)
        else:
            values = values or []
            d = distinct_objects(values)
            out.put_bytes += sum(len(v.data) for v in values if isinstance(v, objects.Pickled))
        rows: list[int | None] = [index.get(partition, name, key) for key in d.keys]
        new = [j for j, row in enumerate(rows) if row is None]
        out.reused += [(name, key) for key, row in zip(d.keys, rows, strict=True) if row is not None]
        if new:
            positions = [d.first[j] for j in new]
            part: AnyColumn | list[Any]
            if col is not None:
                part = taken = _take_column(col, positions)
                out.stored_bytes += _values_bytes(taken)
            else:
                part = [values[i] for i in positions if values is not None]
                out.stored_bytes += sum(len(v.data) for v in part if isinstance(v, objects.Pickled))
            start = await put_payload(name, part, len(new))
            for k, j in enumerate(new):
                rows[j] = start + k
                index.add(partition, name, d.keys[j], start + k)
        if values is not None:
            # a value that is not pickled (None) stays a value of its sample, not a reference
            pickled = [isinstance(v, objects.Pickled) for v in values]
            refs: list[Any] = [rows[at] if p else None for at, p in zip(d.inverse, pickled, strict=True)]
        else:
            refs = [rows[at] for at in d.inverse]
        out.other[ref_field(name)] = refs
    return out


def request_fields(fields: list[str] | None, kinds: Mapping[str, str]) -> list[str] | None:
    """Fields a caller names, with a deduped field asked for by its own name turned into its references."""
    if fields is None:
        return None
    return [ref_field(f) if ref_field(f) in kinds and not f.endswith(REF_SUFFIX) else f for f in fields]


def ref_fields(data: Mapping[str, Any]) -> list[str]:
    return [name for name in data if name.endswith(REF_SUFFIX)]


FetchPayloads = Callable[[str, list[int]], Awaitable[Any]]
"""(field, payload row indexes) -> a get_data result holding the field's values of those rows."""


async def resolve(data: dict[str, Any], fetch: FetchPayloads) -> list[Any]:
    """Turn every ``<name>@payload`` field of ``data`` into ``<name>``: each sample's value a view of its one
    copy (the stacked array as stored where no sample repeats another). Returns what was fetched (to keep
    alive and release with ``data``)."""
    fetched = []
    for key in ref_fields(data):
        refs = data.pop(key)
        name = key[: -len(REF_SUFFIX)]
        present = [r for r in refs if r is not None]
        if not present:
            data[name] = list(refs)
            continue
        wanted = sorted(set(present))
        got = await fetch(name, wanted)
        fetched.append(got)
        values = got[name]
        if len(present) == len(refs) and refs == wanted and not isinstance(values, list):
            data[name] = values  # no value repeats: the payload array itself, as a put without dedup gives
            continue
        if getattr(values, "is_nested", False):  # a jagged field's payloads: one tensor per row
            values = values.unbind()
        at = {row: j for j, row in enumerate(wanted)}
        data[name] = [None if r is None else values[at[r]] for r in refs]
    return fetched
