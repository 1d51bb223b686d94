"""Dense tensor fields of a get_data reply as raw frames: one ZeroMQ frame per field, the samples' bytes as they
lie in memory, described in the reply by ``[name, kind, dtype name, sample shape]`` (the frames follow the rows
buffer, in that order). A client asks for this with ``columns=True`` (``get_data``, ``take`` with fields); the
broker fills the frames from ``Topic.sample_columns`` (engine/columnar.py), so no value per sample is packed on
either side. A reply to a client that does not ask has its fields in the rows buffer only, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ProtocolError
from ..tensors.column import storage_dtype


def frames(dense: Mapping[str, tuple[str, str, np.ndarray]]) -> tuple[list[list[Any]], list[Any]]:
    """The reply's entries and frames of ``dense`` (field -> (kind, dtype name, samples)); each frame a memoryview
    of the field's array, not bytes (ZeroMQ copies any buffer into its message: one copy, not two)."""
    entries: list[list[Any]] = []
    out: list[Any] = []
    for name, (kind, dtype_name, array) in dense.items():
        entries.append([name, kind, dtype_name, list(array.shape[1:])])
        out.append(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
    return entries, out


def arrays(entries: Any, buffers: Sequence[Any], n: int) -> dict[str, tuple[str, str, np.ndarray]]:
    """The fields of a reply's ``entries`` from their frames: ``n`` samples each, a read-only view of its frame
    (``batches.from_columns`` makes the consumer's own copy). ProtocolError if they do not agree."""
    if not isinstance(entries, list) or len(entries) != len(buffers):
        raise ProtocolError(f"a data reply names {entries!r:.80} columns for {len(buffers)} frames")
    out: dict[str, tuple[str, str, np.ndarray]] = {}
    for entry, buf in zip(entries, buffers, strict=True):
        if not (isinstance(entry, list) and len(entry) == 4 and all(isinstance(x, str) for x in entry[:3])):
            raise ProtocolError(f"a data reply's column entry is [name, kind, dtype, shape], got {entry!r:.80}")
        name, kind, dtype_name, shape = entry
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ProtocolError(f"column {name!r}: sample shape {shape!r:.80} is not a list of sizes")
        dtype = storage_dtype(kind, dtype_name)
        want = n * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(memoryview(buf)) != want:
            raise ProtocolError(f"column {name!r}: {len(memoryview(buf))} bytes, not {want} for {n}x{shape}")
        out[name] = (kind, dtype_name, np.frombuffer(buf, dtype=dtype).reshape((n, *shape)))
    return out
