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

from ..errors import InvalidRecordError
from ..wire.columns import Parts as Parts  # where the engine and readers look for it
from . import jagged

# The dtype helpers live in a leaf (jagged uses them too); ``column`` keeps offering them where callers look.
from .dtypes import TORCH_DTYPES as TORCH_DTYPES
from .dtypes import is_torch as is_torch
from .dtypes import storage_dtype as storage_dtype
from .dtypes import to_user as to_user
from .dtypes import torch_to_host

if TYPE_CHECKING:
    import numpy as np

    from .jagged import JaggedColumn
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it


def is_tensor_dict(data: Any) -> bool:
    """A ``tensordict.TensorDict`` (or any TensorDictBase), without importing the package: whoever made one has
    imported it. (Recent tensordict releases register TensorDict as a Mapping, so shape alone does not tell.)"""
    module = sys.modules.get("tensordict")
    base = getattr(module, "TensorDictBase", None)
    return base is not None and isinstance(data, base)


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
            col = jagged.from_torch(name, value, torch_to_host)
        elif is_torch(value):
            dtype_name, arr = torch_to_host(value)
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


def stack(samples: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """Samples stacked along a new batch dimension when their shapes agree (a copy), else the list."""
    if not samples:
        return []
    shape = samples[0].shape
    if all(s.shape == shape for s in samples):
        return np.stack(samples)
    return samples
