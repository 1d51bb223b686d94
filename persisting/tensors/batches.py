"""Tensor batches between the user and a topic: rows to store, metas to return, arrays to hand back.

Two ways a batch travels. The copy path (embedded mode, ``zerocopy_mode="off"``, or no arena): each sample
becomes a row whose tensor fields hold encoded bytes, exactly like records. The arena path (broker mode): the
producer writes each field's whole batch once into a leased extent (``layout``), and consumers get copy-on-write
views of the broker's arena (``from_runs``: a private mapping per call, so what a consumer writes stays its own),
kept alive by reference: when the last array made from a ``get_data`` call is garbage-collected the mapping goes
and the broker is told to release the hold.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ProtocolError
from ..wire import codec
from . import column as tensors
from . import jagged, pinning
from .arena import FIELD_ALIGN_BYTES, SEGMENT_SHIFT, Arena, align_up
from .column import AnyColumn
from .meta import BatchMeta, FieldMeta, ProductionStatus, SampleMeta, sample_metas

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it


def other_rows(other: Mapping[str, list[Any]], n: int, known_kinds: Mapping[str, str]) -> codec.EncodedBatch:
    """The non-tensor fields as ``n`` encoded rows (empty rows when there are none)."""
    if not other:  # a tensors-only batch: nothing to check per sample
        return codec.EncodedBatch([{} for _ in range(n)], {})
    records = [{name: values[i] for name, values in other.items()} for i in range(n)]
    return codec.encode_batch(records, known_kinds, refs=True)  # a put checked its own names (codec.reserved)


def full_rows(
    columns: Mapping[str, AnyColumn], other: Mapping[str, list[Any]], n: int, known_kinds: Mapping[str, str]
) -> codec.EncodedBatch:
    """Every field of every sample as encoded rows (the copy path)."""
    batch = other_rows(other, n, known_kinds)
    kinds = dict(batch.kinds)
    for name, col in columns.items():
        kinds[name] = col.kind
        ragged = col.ragged_dim if isinstance(col, jagged.JaggedColumn) else 0
        for i, row in enumerate(batch.rows):
            row[name] = codec.encode_sample(col.kind, col.dtype_name, col.sample(i), ragged)
    return codec.EncodedBatch(batch.rows, kinds)


def layout(columns: Mapping[str, AnyColumn]) -> tuple[list[tuple[str, AnyColumn, int, int]], int]:
    """Where each field goes in an extent: (name, column, offset, nbytes), and the extent size. A jagged field
    takes its values, then its offsets at the next aligned offset (``jagged_offsets_at``)."""
    out = []
    cursor = 0
    for name, col in columns.items():
        offset = align_up(cursor, FIELD_ALIGN_BYTES)
        out.append((name, col, offset, col.nbytes))
        if isinstance(col, jagged.JaggedColumn):
            cursor = jagged_offsets_at(offset, col.values.nbytes) + col.offsets.nbytes
        else:
            cursor = offset + col.nbytes
    return out, cursor


def wire_field(name: str, col: AnyColumn, offset: int) -> list[Any]:
    """A field of a ``put_tensors`` layout: ``[name, kind, dtype, sample shape, offset, nbytes]``; a jagged field
    ``[name, "jagged", dtype, sample shape with -1 at the ragged dimension, offset, values nbytes, offsets offset,
    values along the ragged dimension]`` (its offsets: ``count + 1`` int64 from 0)."""
    if isinstance(col, jagged.JaggedColumn):
        nbytes = col.values.nbytes
        at = jagged_offsets_at(offset, nbytes)
        return [name, col.kind, col.dtype_name, list(col.sample_shape), offset, nbytes, at, col.total]
    return [name, col.kind, col.dtype_name, list(col.sample_shape), offset, col.nbytes]


def jagged_offsets_at(offset: int, values_nbytes: int) -> int:
    """Where a jagged field's offsets lie in an extent: after its values, aligned."""
    return align_up(offset + values_nbytes, FIELD_ALIGN_BYTES)


def batch_meta(
    first: int,
    n: int,
    partition: str,
    columns: Mapping[str, AnyColumn],
    other: Mapping[str, Any],
    patch: BatchMeta | None = None,
) -> BatchMeta:
    """The meta of a put: its new samples, or (``patch``) the samples it wrote fields of, with those fields."""
    fields = {name: FieldMeta(name, col.kind, col.dtype_name, col.sample_shape) for name, col in columns.items()}
    fields.update({name: FieldMeta(name, "value") for name in other})
    if patch is not None:
        return BatchMeta(
            tuple(replace(s, fields={**s.fields, **fields}) for s in patch.samples),
            {**patch.extra_info, "fields": None},
        )
    return BatchMeta.of_run(first, n, partition, fields)  # its SampleMetas made when first asked for


def meta_from(indexes: list[int], partition: str, runs: list[list[Any]], fields: list[str] | None) -> BatchMeta:
    """A BatchMeta from ``Topic.describe``'s runs; the samples of one run share one fields mapping (and tags)."""
    samples: list[SampleMeta] = []
    at = 0
    for count, desc, *rest in runs:
        tags = dict(rest[0]) if rest and rest[0] else None
        chosen = {
            name: FieldMeta(name, str(kind), str(dtype), tuple(int(d) for d in shape))
            for name, (kind, dtype, shape) in desc.items()
            if fields is None or name in fields
        }
        for name in fields or ():
            if name not in chosen:  # asked for and not written yet for these samples
                chosen[name] = FieldMeta(name, "", production_status=ProductionStatus.NOT_PRODUCED)
        samples.extend(sample_metas(indexes[at : at + int(count)], partition, chosen, tags))
        at += int(count)
    if at != len(indexes) or len(samples) != len(indexes):
        raise ProtocolError(f"field descriptions cover {len(samples)} samples, not {len(indexes)}")
    return BatchMeta(tuple(samples), {"fields": list(fields) if fields is not None else None})


def wanted_fields(meta: BatchMeta) -> list[str]:
    fields = meta.extra_info.get("fields")
    return list(fields) if fields else meta.field_names


def from_rows(rows: list[dict[str, Any]], kinds: Mapping[str, str], fields: list[str], device: Any) -> Batch:
    """The copy path: stored rows to the user's kinds, stacked per field when shapes agree."""
    out = Batch()
    for name in fields:
        kind = kinds.get(name)
        values = [row.get(name) for row in rows]
        if kind == jagged.KIND:
            out[name] = _jagged_from_rows(values, device)
        elif kind in ("ndarray", "tensor"):
            decoded = [None if v is None else codec.decode_sample(kind, v) for v in values]
            if any(d is None for d in decoded):
                out[name] = [None if d is None else tensors.to_user(d[1], kind, d[0], device) for d in decoded]
                continue
            present = [d for d in decoded if d is not None]
            dtype_name = present[0][0] if present else ""
            stacked = tensors.stack([d[1] for d in present])
            if isinstance(stacked, list):
                out[name] = [tensors.to_user(a, kind, dtype_name, device) for a in stacked]
            else:
                out[name] = tensors.to_user(stacked, kind, dtype_name, device)
        else:
            out[name] = [r[name] for r in codec.decode_rows([{name: v} for v in values], kinds)]
    return out


def from_columns(
    dense: Mapping[str, tuple[str, str, Any]],
    rows: list[dict[str, Any]],
    kinds: Mapping[str, str],
    fields: list[str],
    device: Any,
    copy: bool = True,
) -> Batch:
    """The copy path with the dense fields read as columns (engine/columnar.py: (kind, dtype name, samples) each;
    a read-only one, a view of what Lance returned or of a reply's frame, is copied: the consumer's own), the other
    fields from ``rows``; in the order of ``fields``. ``copy=False``: read-only ones are left as they are (a piece
    that ``pieces.Gathered`` copies into the result at once)."""
    rest = from_rows(rows, kinds, [f for f in fields if f not in dense], device)
    out = Batch()
    for name in fields:
        if name in dense:
            kind, dtype_name, array = dense[name]
            if isinstance(array, tensors.Parts):  # one array per fragment: joined (the copy), or left to Gathered
                if not copy:
                    out[name] = tensors.Parts(tensors.to_user(a, kind, dtype_name, device) for a in array)
                    continue
                array = array.joined()
            array = array.copy() if copy and not array.flags.writeable else array
            out[name] = tensors.to_user(array, kind, dtype_name, device)
        elif name in rest:
            out[name] = rest[name]
    return out


def _jagged_from_rows(values: list[Any], device: Any) -> Any:
    """A jagged field read back as rows: one nested tensor (a copy), or a list of samples when some are missing
    or they cannot be joined (samples of several puts that differ in their other dimensions, dtype or ragged
    dimension)."""
    decoded = [None if v is None else codec.decode_jagged(jagged.KIND, v) for v in values]
    present = [d for d in decoded if d is not None]
    if present and len(present) == len(decoded) and len({(d[0], d[2]) for d in present}) == 1:
        col = jagged.assemble([d[1] for d in present], present[0][0], present[0][2])
        if col is not None:
            return jagged.column_to_user(col, device)
    return [None if d is None else tensors.to_user(d[1], "tensor", d[0], device) for d in decoded]


class Batch(dict[str, Any]):
    """What ``get_data`` returns: field -> array, tensor or list. ``release()`` (or leaving a ``with`` block) gives
    arena views back to the broker at once instead of when they are garbage-collected; arrays of a released
    batch must not be used any more (their memory may be reused by later puts). A no-op for copied data."""

    _hold: _Hold | None = None
    _also: tuple[Batch, ...] = ()  # batches this one's values come from (deduped fields' payloads)

    def release(self) -> None:
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.release_now()
        also, self._also = self._also, ()
        for batch in also:
            batch.release()

    def also(self, batches: list[Any]) -> None:
        """Release ``batches`` with this one (they hold what some of its values view)."""
        self._also = (*self._also, *batches)

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Hold:
    """Counts the live arrays of one get_data; the last one to go tells the broker (once)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self._live = 0
        self._lock = threading.Lock()  # finalizers may run in any thread

    def track(self, owner: np.ndarray) -> None:
        with self._lock:
            self._live += 1
        weakref.finalize(owner, self._drop)

    def _drop(self) -> None:
        with self._lock:
            self._live -= 1
            release = self._release if self._live == 0 else None
            if release is not None:
                self._release = None
        if release is not None:
            release()

    @property
    def tracked(self) -> bool:
        with self._lock:
            return self._live > 0

    def release_now(self) -> None:
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()


def from_runs(
    arena: Arena,
    runs: list[list[list[Any]]],
    fields: list[str],
    mode: str,
    device: Any,
    release: Callable[[], None],
    pin: bool = False,
) -> tuple[Batch, int, int]:
    """The arena path: writable copy-on-write views of the broker's arena (``Arena.private``: one mapping per call,
    so what the caller writes stays its own), one per field when the samples are one run.

    ``pin`` (``Queue(pin_memory=True)``) with a CUDA ``device``: read from the page-locked shared mapping instead
    (``Arena.view``; tensors/pinning.py): the copies to the device are DMA, queued without blocking, and waited
    for before the views go (then the hold goes back). The result is device memory, the caller's own.

    Returns (data, bytes handed over without a copy, bytes copied). Samples from several puts lie in several
    extents: ``mode="force"`` refuses that, ``"auto"`` concatenates them (a copy) when their shapes agree.
    """
    pinned = pin and pinning.is_cuda(device)
    hold = _Hold(release)
    out = Batch()
    out._hold = hold
    source = arena.view if pinned else arena.private
    # Jagged fields (values + offsets, engine/reader.py jagged_entry) first, the dense ones below.
    ragged = [entry for run in runs for entry in run if len(entry) == jagged.RUN_ENTRY_LEN]
    zero, copied = jagged.from_runs(out, ragged, source, hold.track, mode, device)
    entries = [entry for run in runs for entry in run if len(entry) != jagged.RUN_ENTRY_LEN]
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 7 and all(type(x) is int and x >= 0 for x in entry[4:])):
            raise ProtocolError("each arena run entry is [name, kind, dtype, shape, offset, count, bytes per sample]")
    per_field: dict[str, list[tuple[list[Any], np.ndarray]]] = {name: [] for name in fields}
    spans: dict[int, list[int]] = {}  # segment index -> [lowest offset, end] of this call's extents there
    for entry in entries:
        span = spans.setdefault(entry[4] >> SEGMENT_SHIFT, [entry[4], entry[4]])
        span[0], span[1] = min(span[0], entry[4]), max(span[1], entry[4] + entry[5] * entry[6])
    # One mapping over every extent of this call in one segment: one mmap per get_data and segment, not one per
    # field or extent.
    windows = {index: source(lo, hi - lo) for index, (lo, hi) in spans.items()}
    for window in windows.values():
        hold.track(window)
    for name, kind, dtype_name, shape, offset, count, per in entries:  # in the runs' order: samples keep theirs
        index = offset >> SEGMENT_SHIFT
        at = offset - spans[index][0]
        part = windows[index][at : at + count * per]
        arr = part.view(tensors.storage_dtype(kind, dtype_name)).reshape((count, *shape))
        per_field[name].append(([kind, dtype_name], arr))
    if entries:
        del window, part, arr
    windows.clear()
    for name, parts in per_field.items():
        if not parts:
            continue
        kind, dtype_name = parts[0][0]
        arrays = [a for _, a in parts]
        nbytes = sum(a.nbytes for a in arrays)
        if len(arrays) == 1:
            out[name] = tensors.to_user(arrays[0], kind, dtype_name, device, pinned)
            zero += nbytes
            continue
        if mode == "force":
            raise ConfigError(
                f"field {name!r}: the samples lie in {len(arrays)} separate arena extents (several puts), so one "
                "array needs a copy; zerocopy_mode='force' refuses it (ask per put, or use 'auto')"
            )
        if all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
            if pinned and kind != "ndarray":  # each part DMA'd, joined on the device
                out[name] = pinning.cat([tensors.to_user(a, kind, dtype_name, device, True) for a in arrays])
            else:
                out[name] = tensors.to_user(np.concatenate(arrays), kind, dtype_name, device)
            copied += nbytes
        else:
            out[name] = [tensors.to_user(s, kind, dtype_name, device) for a in arrays for s in a]
            zero += nbytes
    if pinned and hold.tracked:
        pinning.wait(device)  # the non-blocking copies read the shared mapping: done before the views go
    if not hold.tracked:
        hold.release_now()  # no view was made (no tensor field): nothing will ever release it otherwise
    return out, zero, copied
