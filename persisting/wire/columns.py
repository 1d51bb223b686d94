"""Dense tensor fields of a get_data reply as raw frames: one ZeroMQ frame per field, the samples' bytes as they
lie in memory, described in the reply by ``[name, kind, dtype name, sample shape]`` (the frames follow the rows
buffer, in that order); a field whose samples lie in several arrays (``Parts``: one per Lance fragment) has one
frame per array and the samples in each appended to its entry: ``[name, kind, dtype, shape, [n1, n2, ...]]``.
A client asks for this with ``columns=True`` (``get_data``, ``take`` with fields); the broker fills the frames
from ``Topic.sample_columns`` (engine/columnar.py), so no value per sample is packed on either side. A reply
to a client that does not ask has its fields in the rows buffer only, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import zmq

from ..errors import ProtocolError
from . import tensor_kinds

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it


def frames(dense: Mapping[str, tuple[str, str, Any]]) -> tuple[list[list[Any]], list[Any]]:
    """The reply's entries and frames of ``dense`` (field -> (kind, dtype name, samples: an array or ``Parts``)).
    Each frame a ``zmq.Frame`` over the array, sent without a copy (one over zmq.COPY_THRESHOLD): the arrays are
    the reply's own (what Lance returned, or made for it), read by ZeroMQ's I/O thread, then let go."""
    entries: list[list[Any]] = []
    out: list[Any] = []
    for name, (kind, dtype_name, held) in dense.items():
        arrays = list(held) if isinstance(held, Parts) else [held]
        entry = [name, kind, dtype_name, list(arrays[0].shape[1:])]
        entries.append([*entry, [len(a) for a in arrays]] if isinstance(held, Parts) else entry)
        for array in arrays:
            out.append(zmq.Frame(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))))  # type: ignore[arg-type]
    return entries, out


def arrays(entries: Any, buffers: Sequence[Any], n: int) -> dict[str, tuple[str, str, Any]]:
    """The fields of a reply's ``entries`` from their frames: ``n`` samples each, a read-only view of its frame, or
    ``Parts`` of views for a field of several frames (``batches.from_columns`` makes the consumer's own copy).
    ProtocolError if they do not agree."""
    if not isinstance(entries, list):
        raise ProtocolError(f"a data reply names {entries!r:.80} columns")
    out: dict[str, tuple[str, str, Any]] = {}
    at = 0
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) in (4, 5) and all(isinstance(x, str) for x in entry[:3])):
            raise ProtocolError(f"a data reply's column entry is [name, kind, dtype, shape], got {entry!r:.80}")
        name, kind, dtype_name, shape = entry[:4]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ProtocolError(f"column {name!r}: sample shape {shape!r:.80} is not a list of sizes")
        counts = entry[4] if len(entry) == 5 else [n]
        if not (isinstance(counts, list) and all(type(c) is int and c >= 0 for c in counts) and sum(counts) == n):
            raise ProtocolError(f"column {name!r}: frames of {counts!r:.80} samples, not {n} in all")
        if at + len(counts) > len(buffers):
            raise ProtocolError(f"a data reply names more column frames than its {len(buffers)}")
        dtype = tensor_kinds.registered().storage_dtype(kind, dtype_name)
        views = []
        for count, buf in zip(counts, buffers[at : at + len(counts)], strict=True):
            want = count * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if len(memoryview(buf)) != want:
                raise ProtocolError(f"column {name!r}: {len(memoryview(buf))} bytes, not {want} for {count}x{shape}")
            views.append(np.frombuffer(buf, dtype=dtype).reshape((count, *shape)))
        at += len(counts)
        out[name] = (kind, dtype_name, Parts(views) if len(entry) == 5 else views[0])
    if at != len(buffers):
        raise ProtocolError(f"a data reply's columns name {at} frames for {len(buffers)}")
    return out


class Parts(list[Any]):
    """One field's samples, in order, as several arrays (or tensors) of one dtype and sample shape, batch dimension
    first: the samples of a piece of a big read that Lance returned in one array per fragment, passed on as they
    are (one reply frame each) so that the one copy is made where they are gathered
    (``Gathered`` in ``tensors/pieces.py``)."""

    @property
    def nbytes(self) -> int:
        return sum(int(part.nbytes) for part in self)

    def joined(self) -> np.ndarray:
        """The samples in one array (a copy, the caller's own)."""
        return np.concatenate(self) if len(self) > 1 else np.array(self[0])
