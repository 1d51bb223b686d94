"""Tensor fields as typed Arrow columns: how a topic's tensor values lie in Lance, and how they come back.

The engine hands the Lance backend each tensor field of a flush as *parts* covering the bucket's rows in order:
a ``Column`` (a batch's samples in shared memory or in a host array, batch dimension first) or a list of row
values (the codec's self-describing bytes, or None). This module picks the field's layout and builds its Arrow
array; an arena batch's samples become Arrow buffers over the very memory they lie in (no copy on the way to
Lance). The layout is written in the field's metadata, so pyarrow, DuckDB or Polars see what is stored::

    layout (persisting.layout)  Arrow type                                        when
    fixed_shape_tensor          arrow.fixed_shape_tensor(value_type, shape)       every sample one dtype and shape
    scalar                      value_type (a plain column)                       ... and the samples are 0-d
    variable_shape_tensor       struct<data: large_list<value_type>,              one dtype, shapes that differ
                                       shape: list<int32>>  (row-major data)     (or samples of no elements)
    bytes                       large_binary: the codec's msgpack encoding        anything else (dtypes that change,
                                (persisting 0.1's layout; read for old topics)    numpy scalars, structured dtypes)
    list                        large_list<...<leaf>> (nested_columns)           ``nested`` record values: lists of
                                                                                  one scalar type at one depth

    field metadata: persisting.layout, persisting.kind ("ndarray", "tensor": torch, "jagged": see jagged_columns),
    persisting.dtype (numpy dtype str such as "<f4", or torch dtype name such as "bfloat16"), persisting.ragged_dim

Value types: the numpy/torch dtype's Arrow twin (int8..uint64, float16/32/64), except where Arrow has none with
the same bytes: bool is uint8 (0/1; Arrow's bool is bit-packed), bfloat16 is uint16 (its bits), complex64/128
are float32/64 with a trailing dimension of 2 (real, imaginary), and a non-native byte order is stored native.
The canonical ``arrow.variable_shape_tensor`` is not used: pyarrow 26 has no type for it, and it fixes ndim.

A field's layout in a bucket is decided by its first write and moves only forward: ``fixed``/``scalar`` to
``variable`` (the first sample of another shape), and either to ``bytes`` (another dtype); the backend then
rewrites that one column (``convert``). Reads turn every layout back into the codec's row values, so the engine
and every reader above the backend see rows as they always did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import CorruptionError
from ..tensors.column import AnyColumn, Column, storage_dtype
from ..tensors.jagged import KIND as JAGGED
from ..tensors.jagged import JaggedColumn
from ..wire import codec
from . import jagged_columns, nested_columns

LAYOUT_KEY = b"persisting.layout"
KIND_KEY = b"persisting.kind"
DTYPE_KEY = b"persisting.dtype"
RAGGED_KEY = b"persisting.ragged_dim"

FIXED = "fixed_shape_tensor"
SCALAR = "scalar"
VARIABLE = "variable_shape_tensor"
BYTES = "bytes"
LIST = "list"
NESTED = "nested"

Part = AnyColumn | list[Any]
"""What the engine hands over for some rows of one tensor field: a Column (its samples) or row values."""


@dataclass(slots=True)
class Run:
    """Consecutive rows of one field: typed samples (``array``: storage dtype, batch dimension first), ``count``
    nulls (``array`` None), or values kept as encoded bytes (``opaque``). Jagged samples: ``array`` holds their
    values (the ragged dimension ``ragged`` holding one sample after the other), ``offsets`` where each starts."""

    count: int
    dtype_name: str = ""
    array: np.ndarray | None = None
    opaque: list[bytes | None] | None = None
    offsets: np.ndarray | None = None
    ragged: int = 0

    @property
    def sig(self) -> tuple[str, tuple[int, ...] | None] | None:
        if self.array is None:
            return None
        return (self.dtype_name, None if self.offsets is not None else tuple(self.array.shape[1:]))

    def jagged(self) -> JaggedColumn:
        if self.array is None or self.offsets is None:
            raise CorruptionError("a run of dense samples reached a jagged column")
        return JaggedColumn(self.dtype_name, self.array, self.offsets, self.ragged)


@dataclass(frozen=True, slots=True)
class Layout:
    """What a column holds: its layout, the field's kind and dtype, and the sample shape (fixed layouts)."""

    layout: str
    kind: str
    dtype_name: str = ""
    shape: tuple[int, ...] = ()

    @classmethod
    def of_field(cls, field: pa.Field) -> Layout:
        """The layout of a stored column; a large_binary column without metadata is a 0.1 topic's bytes."""
        meta = field.metadata or {}
        layout = meta.get(LAYOUT_KEY, b"").decode()
        if not layout:
            return cls(BYTES, "")
        kind, dtype_name = meta.get(KIND_KEY, b"").decode(), meta.get(DTYPE_KEY, b"").decode()
        shape: tuple[int, ...] = ()
        if layout == LIST:
            depth, t = 0, field.type
            while pa.types.is_large_list(t):
                depth, t = depth + 1, t.value_type
            shape = (depth,)
        if layout == FIXED:
            shape = tuple(int(d) for d in field.type.shape)
            if _complex(kind, dtype_name):
                shape = shape[:-1]
        if layout == VARIABLE and kind == JAGGED:
            shape = (int(meta.get(RAGGED_KEY, b"0")),)  # a jagged field's ragged dimension
        return cls(layout, kind, dtype_name, shape)

    def field(self, column: str) -> pa.Field:
        meta = {LAYOUT_KEY: self.layout.encode(), KIND_KEY: self.kind.encode(), DTYPE_KEY: self.dtype_name.encode()}
        if self.layout == VARIABLE and self.kind == JAGGED:
            meta[RAGGED_KEY] = str(self.ragged).encode()
        return pa.field(column, self.arrow_type(), nullable=True, metadata=meta)

    @property
    def ragged(self) -> int:
        """A jagged field's ragged dimension (0 for other fields)."""
        return self.shape[0] if self.kind == JAGGED and self.layout == VARIABLE and self.shape else 0

    def arrow_type(self) -> pa.DataType:
        if self.layout == BYTES:
            return pa.large_binary()
        if self.layout == LIST:
            return nested_columns.arrow_type(self.dtype_name, self.shape[0])
        value_type, extra = _value_type(self.kind, self.dtype_name)
        if self.layout == SCALAR:
            return value_type
        if self.layout == FIXED:
            return pa.fixed_shape_tensor(value_type, [*self.shape, *extra])
        return pa.struct([("data", pa.large_list(value_type)), ("shape", pa.list_(pa.int32()))])


def _complex(kind: str, dtype_name: str) -> bool:
    return storage_dtype(kind, dtype_name).kind == "c"


def _value_type(kind: str, dtype_name: str) -> tuple[pa.DataType, tuple[int, ...]]:
    """The Arrow value type of a dtype, and the trailing dimension its samples gain (complex: 2)."""
    if kind in ("tensor", JAGGED) and dtype_name == "bfloat16":
        return pa.uint16(), ()
    dtype = storage_dtype(kind, dtype_name)
    if dtype.kind == "b":
        return pa.uint8(), ()
    if dtype.kind == "c":
        return pa.from_numpy_dtype(np.dtype(f"f{dtype.itemsize // 2}")), (2,)
    return pa.from_numpy_dtype(dtype.newbyteorder("=")), ()


def _arrow_values(kind: str, dtype_name: str, arr: np.ndarray) -> np.ndarray:
    """The samples as the value type's numpy array (a view where the bytes already agree, else a copy)."""
    dtype = arr.dtype
    if kind in ("tensor", JAGGED) and dtype_name == "bfloat16":
        return arr.view(np.uint16)
    if dtype.kind == "b":
        return arr.view(np.uint8)
    if dtype.kind == "c":
        native = arr.astype(dtype.newbyteorder("="), copy=False)
        return native.view(np.dtype(f"f{dtype.itemsize // 2}")).reshape((*arr.shape, 2))
    return arr.astype(dtype.newbyteorder("="), copy=False)


def from_arrow_values(layout: Layout, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Back from value-type numbers to samples in the storage dtype, ``shape`` = (n, *sample shape)."""
    dtype = storage_dtype(layout.kind, layout.dtype_name)
    if dtype.kind == "c":
        native = values.view(dtype.newbyteorder("="))
    else:
        native = values.view(dtype.newbyteorder("=")) if dtype.kind != "b" else values.view(np.bool_)
    return native.reshape(shape).astype(dtype, copy=False)


# -- parts to runs ----------------------------------------------------------------------------------------


def _typed(kind: str, value: Any) -> tuple[str, np.ndarray] | None:
    """(dtype name, sample) of an encoded row value a typed layout can hold, else None (it stays bytes)."""
    if kind == "tensor":
        return codec.decode_sample(kind, value)
    try:
        arr = codec.decode_sample(kind, value)[1]
    except CorruptionError:
        return None  # a numpy scalar (kept a scalar by the bytes layout) or another non-array value
    try:
        storage_dtype("ndarray", arr.dtype.str)
    except codec.InvalidRecordError:
        return None  # structured, string, datetime ... dtypes: records may hold them, typed columns cannot
    return arr.dtype.str, arr


def to_runs(kind: str, parts: Sequence[Part]) -> list[Run]:
    """The parts as runs; consecutive row values of one dtype and shape are stacked (a copy: records are small)."""
    runs: list[Run] = []
    if kind == NESTED:  # row values only: nested_columns looks at them whole
        return [Run(len(part), opaque=list(part)) for part in parts if isinstance(part, list)]
    if kind == JAGGED:
        return [Run(c) if isinstance(c, int) else _jagged_run(c) for c in jagged_columns.runs(parts)]
    for part in parts:
        if isinstance(part, Column):
            runs.append(Run(part.array.shape[0], part.dtype_name, part.array))
            continue
        if isinstance(part, JaggedColumn):  # a jagged batch in a dense field: the put refused it, never here
            raise CorruptionError("a jagged column reached a dense tensor field")
        pending: list[tuple[str, np.ndarray]] = []
        for value in part:
            typed = None if value is None else _typed(kind, value)
            if pending and (typed is None or pending[0][0] != typed[0] or pending[0][1].shape != typed[1].shape):
                runs.append(_stacked(pending))
                pending = []
            if typed is not None:
                pending.append(typed)
            elif value is not None:
                runs.append(Run(1, opaque=[value]))
            elif runs and runs[-1].array is None and runs[-1].opaque is None:
                runs[-1].count += 1
            else:
                runs.append(Run(1))
        if pending:
            runs.append(_stacked(pending))
    return runs


def _jagged_run(col: JaggedColumn) -> Run:
    return Run(col.count, col.dtype_name, col.values, offsets=col.offsets, ragged=col.ragged_dim)


def _stacked(samples: list[tuple[str, np.ndarray]]) -> Run:
    return Run(len(samples), samples[0][0], np.stack([a for _, a in samples]))


def choose(kind: str, runs: Sequence[Run], stored: Layout | None) -> Layout | None:
    """The layout that holds both what is stored (``stored``) and ``runs``, as typed as it can be; None when
    there is no column yet and nothing but nulls to write (no column is made for them)."""
    if kind == NESTED:
        return _choose_nested(runs, stored)
    if stored is not None and (stored.layout == BYTES or stored.kind != kind):
        return Layout(BYTES, kind)  # (a 0.1 topic's bytes column has no kind in its metadata: the field's is used)
    if any(r.opaque is not None for r in runs):
        return Layout(BYTES, kind)
    if kind == JAGGED:
        raggeds = {r.ragged for r in runs if r.array is not None}
        dtypes_j = {r.dtype_name for r in runs if r.array is not None}
        if stored is not None:
            raggeds.add(stored.ragged)
            dtypes_j.add(stored.dtype_name)
        if not dtypes_j:
            return None
        if len(dtypes_j) > 1 or len(raggeds) > 1:
            return Layout(BYTES, kind)
        return Layout(VARIABLE, kind, dtypes_j.pop(), (raggeds.pop(),))
    sigs: set[tuple[str, tuple[int, ...] | None]] = {r.sig for r in runs if r.sig is not None}
    if stored is not None:
        sigs.add((stored.dtype_name, stored.shape if stored.layout in (FIXED, SCALAR) else None))
    dtypes = {dtype for dtype, _ in sigs}
    if not dtypes:
        return None
    if len(dtypes) > 1:
        return Layout(BYTES, kind)
    dtype_name = dtypes.pop()
    shapes = {shape for _, shape in sigs}
    shape = shapes.pop() if len(shapes) == 1 else None
    if shape is None or (shape and not int(np.prod(shape))):
        # Lance refuses a fixed-size list of dimension 0: samples with no elements take the variable layout.
        return Layout(VARIABLE, kind, dtype_name)
    scalar = shape == () and not _complex(kind, dtype_name)  # a complex 0-d sample is a tensor of shape [2]
    return Layout(SCALAR if scalar else FIXED, kind, dtype_name, shape)


def _choose_nested(runs: Sequence[Run], stored: Layout | None) -> Layout | None:
    values = [v for r in runs for v in (r.opaque or ()) if v is not None]
    if stored is not None and (stored.layout != LIST or stored.kind != NESTED):
        return Layout(BYTES, NESTED)
    if not values:
        return stored
    known = None if stored is None else (stored.dtype_name, stored.shape[0])
    shape = nested_columns.choose(values, known)
    return Layout(BYTES, NESTED) if shape is None else Layout(LIST, NESTED, shape[0], (shape[1],))


def needs_rewrite(stored: Layout, layout: Layout) -> bool:
    """Whether the stored column must be rewritten to hold ``layout`` (``choose`` never goes back; a bytes
    column holds everything, a 0.1 topic's included)."""
    return stored.layout != BYTES and stored != layout


# -- runs to Arrow ----------------------------------------------------------------------------------------


def build(layout: Layout, runs: Sequence[Run]) -> pa.ChunkedArray:
    """One column of ``layout`` from ``runs``: a chunk per run, over the runs' own memory where it can be."""
    target = layout.arrow_type()
    if layout.layout == LIST:
        values = [v for r in runs for v in (r.opaque if r.opaque is not None else [None] * r.count)]
        return pa.chunked_array([nested_columns.build(values, (layout.dtype_name, layout.shape[0]))], type=target)
    chunks = [_chunk(layout, target, run) for run in runs if run.count]
    return pa.chunked_array(chunks, type=target)


def _chunk(layout: Layout, target: pa.DataType, run: Run) -> pa.Array:
    if run.array is None and run.opaque is None:
        return pa.nulls(run.count, target)
    if layout.layout == BYTES:
        if run.array is None:
            return pa.array(run.opaque, type=pa.large_binary())
        if run.offsets is not None:
            return jagged_columns.encoded(run.jagged())
        return encoded(layout.kind, run.dtype_name, run.array)
    arr = run.array
    if arr is None:
        raise CorruptionError("a run of bytes values reached a typed column")  # choose() never allows it
    values = _arrow_values(layout.kind, layout.dtype_name, arr)
    if layout.layout == SCALAR:
        return pa.array(values)  # zero-copy for a contiguous native array
    if layout.layout == FIXED:
        flat = pa.array(np.ascontiguousarray(values).reshape(-1))
        # from_buffers, not from_arrays: a sample of no elements (shape (2, 0)) still counts its rows
        storage = pa.Array.from_buffers(target.storage_type, run.count, [None], children=[flat])
        return pa.ExtensionArray.from_storage(target, storage)
    if run.offsets is not None:
        return jagged_columns.chunk(target, run.jagged(), values)
    n = run.count
    per = int(np.prod(arr.shape[1:], dtype=np.int64)) * (2 if values.ndim > arr.ndim else 1)
    offsets = pa.array(np.arange(n + 1, dtype=np.int64) * per)
    data = pa.LargeListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(values).reshape(-1)))
    shape = pa.array([list(arr.shape[1:])] * n, type=pa.list_(pa.int32()))
    return pa.StructArray.from_arrays([data, shape], fields=list(target))


def encoded(kind: str, dtype_name: str, arr: np.ndarray) -> pa.Array:
    """The codec's bytes of each sample of ``arr`` as one large_binary array (one vectorized copy).

    Every sample has the same dtype and shape, so its encoding is one fixed prefix followed by its raw bytes."""
    n = arr.shape[0]
    per = arr.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
    prefix = np.frombuffer(
        codec.encode_sample(kind, dtype_name, np.zeros(arr.shape[1:], arr.dtype))[: -per or None], dtype=np.uint8
    )
    width = len(prefix) + per
    buf = np.empty((n, width), dtype=np.uint8)
    buf[:, : len(prefix)] = prefix
    if per:
        buf[:, len(prefix) :] = np.ascontiguousarray(arr).reshape(n, per // arr.itemsize).view(np.uint8)
    offsets = np.arange(n + 1, dtype=np.int64) * width
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(buf)])


# -- Arrow back to row values -----------------------------------------------------------------------------


def row_values(layout: Layout, column: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    """The codec's row value (bytes or None) of each entry of a stored column of ``layout``."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list[bytes | None] = []
    for chunk in chunks:
        out.extend(_chunk_values(layout, chunk))
    return out


def _chunk_values(layout: Layout, chunk: pa.Array) -> list[bytes | None]:
    n = len(chunk)
    if layout.layout == LIST:
        return nested_columns.row_values((layout.dtype_name, layout.shape[0]), chunk)
    if layout.layout == BYTES:
        return chunk.to_pylist()
    valid = _validity(chunk)
    if layout.layout == SCALAR:
        values = chunk.to_numpy(zero_copy_only=False) if chunk.null_count == 0 else chunk.fill_null(0).to_numpy()
        samples = from_arrow_values(layout, np.asarray(values), (n,))
    elif layout.layout == FIXED:
        storage = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
        size = storage.type.list_size
        flat = storage.values.slice(storage.offset * size, n * size)
        flat = flat.fill_null(0) if flat.null_count else flat
        samples = from_arrow_values(layout, flat.to_numpy(zero_copy_only=False), (n, *layout.shape))
    else:
        return _variable_values(layout, chunk, valid)
    if n == 0:
        return []
    rows = encoded(layout.kind, layout.dtype_name, samples).to_pylist()
    return [v if ok else None for v, ok in zip(rows, valid, strict=True)]


def _validity(chunk: pa.Array) -> list[bool]:
    if chunk.null_count == 0:
        return [True] * len(chunk)
    return chunk.is_valid().to_pylist()


def _variable_values(layout: Layout, chunk: pa.Array, valid: list[bool]) -> list[bytes | None]:
    data, shapes = chunk.field("data"), chunk.field("shape").to_pylist()
    dtype = storage_dtype(layout.kind, layout.dtype_name)
    offsets = data.offsets.to_numpy()
    flat = data.values.to_numpy(zero_copy_only=False)
    out: list[bytes | None] = []
    for i, ok in enumerate(valid):
        if not ok or shapes[i] is None:
            out.append(None)
            continue
        shape = tuple(int(d) for d in shapes[i])
        values = flat[offsets[i] : offsets[i + 1]]
        sample = from_arrow_values(layout, values, shape) if values.size else np.zeros(shape, dtype)
        out.append(codec.encode_sample(layout.kind, layout.dtype_name, sample, layout.ragged))
    return out


def convert(old: Layout, new: Layout, chunk: pa.Array) -> pa.Array:
    """A stored chunk of ``old`` in layout ``new`` (a column rewrite when a field's layout moves on)."""
    runs = to_runs(new.kind or old.kind, [row_values(old, chunk)])
    return build(new, runs).combine_chunks()
