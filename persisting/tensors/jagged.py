"""Jagged ``torch.nested`` tensors (``layout=torch.jagged``) as a field of a tensor batch: values + offsets.

A jagged tensor of ``n`` samples is one values tensor and ``n + 1`` offsets: sample ``i`` is the slice
``offsets[i]:offsets[i+1]`` of values along its ragged dimension (``_ragged_idx - 1`` of values; 0 for the usual
``(batch, j, ...)`` shape). It is stored and handed over as exactly that, never as a padded copy:

- put: ``split`` makes a ``JaggedColumn`` (values contiguous in the storage dtype, offsets rebased to start at 0);
  in broker mode the producer writes values and offsets into its arena extent (the one copy), embedded mode and
  the copy path encode one row value per sample (kind ``jagged``: the sample with its shape and ragged dimension).
- get: ``to_user`` builds ``torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=...)`` over the
  values it is given (arena views in broker mode: no copy); ``assemble`` joins samples read back as rows.
- Lance: the ``variable_shape_tensor`` layout (``struct<data: large_list<value>, shape: list<int32>>``), one row
  per sample in row-major order, readable by any Arrow reader; for the usual ragged dimension 0 its data buffer
  is the values themselves (see ``persisting/storage/tensor_columns.py``).

A sample's shape is described with ``-1`` at the ragged dimension (``(-1,)`` for token ids, ``(-1, 4096)``,
``(8, -1)`` for ``_ragged_idx`` 2): that is the field's ``FieldMeta.shape``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InvalidRecordError, ProtocolError
from .arena import FIELD_ALIGN_BYTES
from .dtypes import JAGGED_KIND, storage_dtype
from .dtypes import to_user as tensor_to_user

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it

KIND = JAGGED_KIND
RAGGED = -1  # the ragged dimension in a described sample shape


def is_nested(value: Any) -> bool:
    """A torch nested tensor (jagged or strided layout)."""
    return bool(getattr(value, "is_nested", False))


@dataclass(slots=True)
class JaggedColumn:
    """One jagged field of a batch on the host. ``values``: storage dtype, C-contiguous, the ragged dimension at
    ``ragged_dim`` holding every sample one after the other; ``offsets``: int64 ``[n + 1]`` from 0, ascending."""

    dtype_name: str  # the torch dtype name
    values: np.ndarray
    offsets: np.ndarray
    ragged_dim: int

    kind = KIND

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.offsets.nbytes)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        shape = list(self.values.shape)
        shape[self.ragged_dim] = RAGGED
        return tuple(shape)

    @property
    def total(self) -> int:
        return int(self.values.shape[self.ragged_dim])

    def sample(self, i: int) -> np.ndarray:
        """Sample ``i`` (a view on values)."""
        cut = [slice(None)] * self.values.ndim
        cut[self.ragged_dim] = slice(int(self.offsets[i]), int(self.offsets[i + 1]))
        return self.values[tuple(cut)]

    def rows(self, start: int, stop: int | None = None) -> JaggedColumn:
        """Samples ``start .. stop`` (values a view, offsets rebased: a small copy)."""
        stop = self.count if stop is None else stop
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        cut = [slice(None)] * self.values.ndim
        cut[self.ragged_dim] = slice(lo, hi)
        return JaggedColumn(
            self.dtype_name, self.values[tuple(cut)], self.offsets[start : stop + 1] - lo, self.ragged_dim
        )


def from_torch(name: str, value: Any, to_host: Any) -> JaggedColumn:
    """A jagged torch nested tensor as a host column; other nested tensors are refused with the fix."""
    import torch

    if value.layout != torch.jagged:
        raise InvalidRecordError(
            f"field {name!r} is a nested tensor with layout {value.layout}; only layout=torch.jagged is stored "
            "(values + offsets): build it with torch.nested.nested_tensor(..., layout=torch.jagged) or "
            "torch.nested.nested_tensor_from_jagged(values, offsets)"
        )
    if getattr(value, "_lengths", None) is not None:
        raise InvalidRecordError(
            f"field {name!r} is a jagged nested tensor with holes (made with lengths=): its samples are not "
            "contiguous in values; store nt.clone() or build it from offsets only"
        )
    ragged = int(value._ragged_idx) - 1
    offsets = value.offsets().detach().to("cpu", torch.int64)
    values = value.values()
    dtype_name, host = to_host(values)
    start = int(offsets[0])
    offs = (offsets - start).numpy()
    if start or int(offs[-1]) != host.shape[ragged]:
        cut = [slice(None)] * host.ndim
        cut[ragged] = slice(start, start + int(offs[-1]))
        host = np.ascontiguousarray(host[tuple(cut)])
    if len(offs) < 1 or np.any(np.diff(offs) < 0):
        raise InvalidRecordError(f"field {name!r}: the jagged tensor's offsets are not ascending")
    return JaggedColumn(dtype_name, host, np.ascontiguousarray(offs, dtype=np.int64), ragged)


def assemble(samples: Sequence[np.ndarray], dtype_name: str, ragged_dim: int) -> JaggedColumn | None:
    """Samples read back one by one as one column (a copy), or None when they cannot be joined (the other
    dimensions differ)."""
    if not samples:
        return None
    inner = [s.shape[:ragged_dim] + s.shape[ragged_dim + 1 :] for s in samples]
    if any(s.ndim != samples[0].ndim for s in samples) or any(i != inner[0] for i in inner):
        return None
    lengths = np.array([s.shape[ragged_dim] for s in samples], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    values = np.concatenate(samples, axis=ragged_dim)
    return JaggedColumn(dtype_name, values, offsets, ragged_dim)


def to_user(values: np.ndarray, offsets: np.ndarray, dtype_name: str, ragged_dim: int, device: Any = None) -> Any:
    """A jagged nested tensor over ``values`` (its memory: ``torch.from_numpy``, no copy)."""
    try:
        import torch
    except ImportError as exc:
        raise ConfigError("this field was put as a torch nested tensor; install torch to read it back") from exc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only arena views: torch warns, we hand them read-only
        v = torch.from_numpy(values)
    if dtype_name == "bfloat16":
        v = v.view(torch.bfloat16)
    o = torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int64))
    if not v.is_contiguous():
        v = v.contiguous()  # a selection of samples along a ragged dimension > 0 (a copy of those samples)
    if device is not None:
        v, o = v.to(device), o.to(device)
    return torch.nested.nested_tensor_from_jagged(v, o, jagged_dim=ragged_dim + 1, **seqlen_bounds(offsets))


def seqlen_bounds(offsets: np.ndarray) -> dict[str, Any]:
    """``min_seqlen``/``max_seqlen`` for ``nested_tensor_from_jagged``: without them torch pads
    ``to_padded_tensor()`` to the length of all the values together instead of the longest sample."""
    lengths = np.diff(np.asarray(offsets))
    return {"min_seqlen": int(lengths.min()), "max_seqlen": int(lengths.max())} if len(lengths) else {}


def column_to_user(col: JaggedColumn, device: Any = None) -> Any:
    return to_user(col.values, col.offsets, col.dtype_name, col.ragged_dim, device)


def from_arena(entry: Any, count: int, view: Any, limit: int | None, base: int = 0) -> JaggedColumn:
    """A jagged field of an arena batch from its layout entry (``batches.wire_field``: ``[name, "jagged", dtype,
    sample shape with one -1, offset, values nbytes, offsets offset, values along the ragged dimension]``),
    checked: ``view(base + offset, nbytes)`` gives the extent's bytes (``limit``: its size, None when ``view``
    checks).
    The offsets are copied (and checked: from 0, ascending, ending at the values' length) so that nothing the
    producer writes later changes which bytes a sample is."""

    _name, kind, dtype_name, shape, offset, nbytes, at, total = entry
    if kind != KIND or not isinstance(shape, list) or not all(type(d) is int and d >= RAGGED for d in shape):
        raise ProtocolError(f"jagged field {_name!r}: bad kind or sample shape {shape!r}")
    if shape.count(RAGGED) != 1 or type(total) is not int or total < 0:
        raise ProtocolError(f"jagged field {_name!r}: the sample shape needs one -1 and a length >= 0")
    dtype = storage_dtype(kind, dtype_name)
    ragged = shape.index(RAGGED)
    full = [total if d == RAGGED else d for d in shape]
    want = int(np.prod(full, dtype=np.int64)) * dtype.itemsize
    ints = all(type(x) is int and x >= 0 for x in (offset, nbytes, at))
    if not ints or nbytes != want or offset % FIELD_ALIGN_BYTES or at % FIELD_ALIGN_BYTES or at < offset + nbytes:
        raise ProtocolError(f"jagged field {_name!r}: {nbytes!r} bytes at {offset!r} do not fit {full}")
    if limit is not None and at + (count + 1) * 8 > limit:
        raise ProtocolError(f"jagged field {_name!r} lies outside its extent ({limit} bytes)")
    offsets = np.array(view(base + at, (count + 1) * 8).view("<i8"), dtype=np.int64)
    if offsets[0] != 0 or offsets[-1] != total or (count and np.any(np.diff(offsets) < 0)):
        raise ProtocolError(f"jagged field {_name!r}: its offsets do not run from 0 up to {total}")
    values = view(base + offset, nbytes).view(dtype).reshape(full)
    return JaggedColumn(str(dtype_name), values, offsets, ragged)


def from_views(entry: Any, view: Any, track: Any) -> JaggedColumn:
    """A jagged run of a ``get_data`` reply (``engine/reader.py`` ``jagged_entry``) as a column over the arena
    (``view(offset, nbytes)``: a checked uint8 view; ``track(owner)``: keeps the hold while it lives). The
    offsets come from the broker and are checked against the values before a view is made."""

    name, kind, dtype_name, shape, offset, count, total, raw = entry
    dtype = storage_dtype(kind, dtype_name)
    if not isinstance(shape, list) or shape.count(RAGGED) != 1 or not isinstance(raw, bytes):
        raise ProtocolError(f"jagged field {name!r}: a malformed run")
    if type(count) is not int or type(total) is not int or total < 0 or len(raw) != (count + 1) * 8:
        raise ProtocolError(f"jagged field {name!r}: {len(raw)} offset bytes for {count!r} samples")
    offsets = np.frombuffer(raw, dtype="<i8").astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    # one sample (the usual run of a selection): two offsets, checked without numpy's per-call cost
    ascending = hi >= lo if count == 1 else not (offsets[1:] < offsets[:-1]).any()
    if lo < 0 or hi > total or not ascending:
        raise ProtocolError(f"jagged field {name!r}: offsets outside the values ({total})")
    ragged = shape.index(RAGGED)
    full = [total if d == RAGGED else int(d) for d in shape]
    owner = view(offset, math.prod(full) * dtype.itemsize)
    track(owner)
    col = JaggedColumn(str(dtype_name), owner.view(dtype).reshape(full), offsets, ragged)
    if lo or hi != total:  # some samples of the block: those, offsets rebased
        cut: list[slice] = [slice(None)] * len(full)
        cut[ragged] = slice(lo, hi)
        col = JaggedColumn(col.dtype_name, col.values[tuple(cut)], offsets - offsets[0], ragged)
    return col


def joined(name: str, cols: list[JaggedColumn], mode: str, device: Any) -> tuple[Any, bool]:
    """One field's runs (from one or several puts) as what ``get_data`` returns, and whether that copied: one
    run is a nested tensor over its views; several are joined (a copy; ``"force"`` refuses), or a list of
    samples when they differ in dtype, ragged dimension or other dimensions."""
    if len(cols) == 1:
        return column_to_user(cols[0], device), not cols[0].values.flags.c_contiguous
    if mode == "force":
        raise ConfigError(
            f"field {name!r}: the samples lie in {len(cols)} separate arena extents (several puts), so one "
            "nested tensor needs a copy; zerocopy_mode='force' refuses it (ask per put, or use 'auto')"
        )
    first = cols[0]
    same = [c.dtype_name == first.dtype_name and c.ragged_dim == first.ragged_dim for c in cols]
    exact = all(c.values.shape[c.ragged_dim] == c.offsets[-1] and c.offsets[0] == 0 for c in cols)
    if all(same) and exact and all(_rest(c) == _rest(first) for c in cols):
        # One values array and one offsets array from the runs' own: no Python work per sample.
        values = np.concatenate([c.values for c in cols], axis=first.ragged_dim)
        starts = np.cumsum([0] + [int(c.offsets[-1]) for c in cols[:-1]])
        tails = [c.offsets[1:] + at for c, at in zip(cols, starts, strict=True)]
        offsets = np.concatenate([cols[0].offsets[:1], *tails])
        return column_to_user(JaggedColumn(first.dtype_name, values, offsets, first.ragged_dim), device), True
    if all(same):
        samples = [c.sample(i) for c in cols for i in range(c.count)]
        col = assemble(samples, first.dtype_name, first.ragged_dim)
        if col is not None:
            return column_to_user(col, device), True
    each = [(c.dtype_name, c.sample(i)) for c in cols for i in range(c.count)]
    return [tensor_to_user(np.ascontiguousarray(s), "tensor", d, device) for d, s in each], True


def _rest(col: JaggedColumn) -> tuple[int, ...]:
    """The values' shape but for the ragged dimension (runs with the same one join into one values array)."""
    shape = list(col.values.shape)
    del shape[col.ragged_dim]
    return tuple(shape)


RUN_ENTRY_LEN = 8  # a jagged field's entry in a get_data reply's runs (dense fields: 7)


def from_runs(
    out: dict[str, Any], entries: list[Any], view: Any, track: Any, mode: str, device: Any
) -> tuple[int, int]:
    """The jagged fields of a ``get_data`` reply into ``out``: one nested tensor per field over arena views
    (``view``, ``track``: see ``from_views``). Returns (bytes handed over without a copy, bytes copied)."""
    by_field: dict[str, list[JaggedColumn]] = {}
    for entry in entries:
        by_field.setdefault(entry[0], []).append(from_views(entry, view, track))
    zero = copied = 0
    for name, cols in by_field.items():
        out[name], was_copied = joined(name, cols, mode, device)
        nbytes = sum(c.values.nbytes for c in cols)
        copied, zero = (copied + nbytes, zero) if was_copied else (copied, zero + nbytes)
    return zero, copied
