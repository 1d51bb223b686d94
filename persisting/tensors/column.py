"""Tensor batches: a mapping of numpy arrays and/or torch tensors sharing the leading (batch) dimension.

``split`` turns what a user passes to ``put(data, partition_id=...)`` into host columns (contiguous numpy
arrays, whatever the source: torch CPU or CUDA, bfloat16, non-contiguous) plus per-sample values of non-tensor
fields. ``assemble`` turns columns back into what ``get_data`` returns: the same kind the field was put as
(numpy in, numpy out; torch in, torch out), stacked along the batch dimension when every sample has the same
shape, else a list of samples.

Each sample becomes one row of the topic; a tensor field's value in a row is one sample of it (kind
``ndarray`` for numpy, ``tensor`` for torch; see codec.py). torch is optional: it is imported only when a
torch tensor is seen or a ``tensor`` field is read back.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from ..errors import ConfigError, InvalidRecordError
from . import jagged

if TYPE_CHECKING:
    import numpy as np

    from .jagged import JaggedColumn
else:
    from .lazy_numpy import np  # imported at first use: a broker client of records never loads it

# torch dtype name -> the numpy dtype that holds the same bytes (bfloat16 has no numpy twin: int16 carries it).
TORCH_DTYPES: dict[str, str] = {
    "bool": "|b1",
    "uint8": "|u1",
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "float16": "<f2",
    "bfloat16": "<i2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
}
_NUMPY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: plain bytes, nothing that needs pickle


def is_torch(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_tensor_dict(data: Any) -> bool:
    """A ``tensordict.TensorDict`` (or any TensorDictBase), without importing the package: whoever made one has
    imported it. (Recent tensordict releases register TensorDict as a Mapping, so shape alone does not tell.)"""
    module = sys.modules.get("tensordict")
    base = getattr(module, "TensorDictBase", None)
    return base is not None and isinstance(data, base)


def storage_dtype(kind: str, dtype_name: str) -> np.dtype[Any]:
    """The numpy dtype whose bytes a stored sample holds; a name a peer sent is checked here."""
    if kind == "tensor" or kind == jagged.KIND:
        name = TORCH_DTYPES.get(dtype_name)
        if name is None:
            raise InvalidRecordError(f"unsupported torch dtype {dtype_name!r}; supported: {sorted(TORCH_DTYPES)}")
        return np.dtype(name)
    if kind != "ndarray" or not isinstance(dtype_name, str):
        raise InvalidRecordError(f"unknown tensor field kind {kind!r}")
    try:
        dtype = np.dtype(dtype_name)
    except TypeError as exc:
        raise InvalidRecordError(f"unknown numpy dtype {dtype_name!r}") from exc
    if dtype.kind not in _NUMPY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise InvalidRecordError(
            f"dtype {dtype_name!r} cannot go in a tensor batch; use bool, int, uint, float or complex dtypes "
            "(or put such values as records)"
        )
    return dtype


@dataclass(slots=True)
class Column:
    """One tensor field of a batch on the host: ``array`` is C-contiguous with the batch dimension first."""

    kind: str  # "ndarray" or "tensor"
    dtype_name: str  # numpy dtype str, or torch dtype name
    array: np.ndarray

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape[1:])

    @property
    def count(self) -> int:
        return int(self.array.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def sample(self, i: int) -> np.ndarray:
        return self.array[i]

    def rows(self, start: int, stop: int | None = None) -> Column:
        """Samples ``start .. stop`` (a view)."""
        return Column(self.kind, self.dtype_name, self.array[start:stop])


AnyColumn = Union[Column, "JaggedColumn"]
"""A tensor field of a batch: dense (``Column``) or jagged (``jagged.JaggedColumn``); both give ``kind``,
``dtype_name``, ``count``, ``nbytes``, ``sample_shape``, ``sample(i)`` and ``rows(start, stop)``."""


def _torch_to_host(t: Any) -> tuple[str, np.ndarray]:
    name = str(t.dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise InvalidRecordError(f"torch dtype {name!r} is not supported; supported: {sorted(TORCH_DTYPES)}")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")  # CUDA tensors are staged to host memory here
    t = t.contiguous()
    if name == "bfloat16":
        import torch

        t = t.view(torch.int16)
    arr = t.numpy()
    return name, arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


MAX_SAMPLE_ELEMENTS = 2**31 - 1


def split(data: Any) -> tuple[dict[str, AnyColumn], dict[str, list[Any]], int]:
    """Host columns, per-sample non-tensor values, and the batch size of ``data``."""
    if not (isinstance(data, Mapping) or is_tensor_dict(data)):
        raise InvalidRecordError(
            f"put(data, partition_id=...) takes a dict of arrays/tensors sharing the batch dimension, "
            f"got {type(data).__qualname__}"
        )
    columns: dict[str, AnyColumn] = {}
    values: dict[str, Sequence[Any]] = {}
    n: int | None = None
    first = ""
    for name, value in data.items():
        if not isinstance(name, str) or not name:
            raise InvalidRecordError(f"tensor batch field names must be non-empty str, got {name!r}")
        col: AnyColumn
        if is_torch(value) and jagged.is_nested(value):
            col = jagged.from_torch(name, value, _torch_to_host)
        elif is_torch(value):
            dtype_name, arr = _torch_to_host(value)
            col = Column("tensor", dtype_name, arr)
        elif isinstance(value, np.ndarray | np.generic):
            value = np.asarray(value)
            storage_dtype("ndarray", value.dtype.str)  # refuses object/structured dtypes with a clear message
            # ascontiguousarray would turn a 0-d array into 1-d: keep ndim so a 0-d field is refused below.
            col = Column("ndarray", value.dtype.str, value if value.flags.c_contiguous else np.ascontiguousarray(value))
        elif isinstance(value, list | tuple):
            values[name] = value
            length = len(value)
            if n is None:
                n, first = length, name
            elif length != n:
                raise InvalidRecordError(f"field {name!r} has {length} samples, field {first!r} has {n}")
            continue
        else:
            raise InvalidRecordError(
                f"field {name!r} holds a {type(value).__qualname__}; a tensor batch holds numpy arrays, torch "
                "tensors, or lists with one value per sample"
            )
        if isinstance(col, Column) and col.array.ndim == 0:
            raise InvalidRecordError(f"field {name!r} is 0-d: it has no batch dimension (reshape it to (1,))")
        if isinstance(col, Column) and col.count and col.array.size // col.count > MAX_SAMPLE_ELEMENTS:
            # Refused here, not at the flush: Lance stores a sample as one Arrow list, whose length is an int32.
            raise InvalidRecordError(
                f"field {name!r}: one sample holds {col.array.size // col.count} elements, more than the "
                f"{MAX_SAMPLE_ELEMENTS} one stored sample may (Arrow's list length); split it into more samples "
                "(e.g. reshape (1, n) to (k, n // k))"
            )
        columns[name] = col
        if n is None:
            n, first = col.count, name
        elif col.count != n:
            raise InvalidRecordError(
                f"field {name!r} has batch dimension {col.count}, field {first!r} has {n}; "
                "every field of a batch shares the leading dimension"
            )
    if n is None:
        raise InvalidRecordError("a tensor batch needs at least one field")
    return columns, {k: list(v) for k, v in values.items()}, n


# -- back to the user ------------------------------------------------------------------------------------


def to_user(arr: np.ndarray, kind: str, dtype_name: str, device: Any = None, non_blocking: bool = False) -> Any:
    """A host array (storage dtype) as the kind it was put as; torch tensors share its memory. ``non_blocking``:
    the copy to ``device`` may still run when this returns (the caller keeps ``arr`` until it waited for it)."""
    if kind == "ndarray":
        if device is not None:
            raise ConfigError(f"device= applies to torch fields; this field was put as numpy ({dtype_name})")
        return arr
    try:
        import torch
    except ImportError as exc:
        raise ConfigError("this field was put as a torch tensor; install torch to read it back") from exc
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only array (none of ours now): torch warns
        t = torch.from_numpy(arr)
    if dtype_name == "bfloat16":
        t = t.view(torch.bfloat16)
    if device is not None:
        t = t.to(device, non_blocking=non_blocking)
    return t


def stack(samples: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """Samples stacked along a new batch dimension when their shapes agree (a copy), else the list."""
    if not samples:
        return []
    shape = samples[0].shape
    if all(s.shape == shape for s in samples):
        return np.stack(samples)
    return samples


class Parts(list[Any]):
    """One field's samples, in order, as several arrays (or tensors) of one dtype and sample shape, batch dimension
    first: the samples of a piece of a big read that Lance returned in one array per fragment, passed on as they
    are (one reply frame each) so that the one copy is made where they are gathered (``pieces.Gathered``)."""

    @property
    def nbytes(self) -> int:
        return sum(int(part.nbytes) for part in self)

    def joined(self) -> np.ndarray:
        """The samples in one array (a copy, the caller's own)."""
        return np.concatenate(self) if len(self) > 1 else np.array(self[0])
