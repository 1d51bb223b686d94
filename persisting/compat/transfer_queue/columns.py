"""TransferQueue's columns in and out of persisting's tensor batches.

In: a TensorDict of ``n`` samples becomes ``put`` input: tensor columns jagged (values + offsets; dense ones
re-viewed, not copied) except per-sample scalars, which stay dense; ``NonTensorStack``/``NonTensorData`` as one
Python object per sample (pickled in the client: the layer's Queue uses ``objects="pickle"``, see the trust model
in the docs page).

Out: TransferQueue 0.1.11 hands each column back by one rule (``SimpleStorageManager._pack_field_values``), and
verl relies on it (``.offsets()``, ``.to_padded_tensor()`` on token columns): per-sample tensors that are all
0-d are stacked densely; other tensors come back as a jagged nested tensor even when every sample has the same
shape (strided nested if jagged cannot hold them, a ``NonTensorStack`` if neither can); anything else is a
``NonTensorStack``. A dense stored column becomes a jagged tensor over the same memory (values + offsets), not
a copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def _torch() -> Any:
    import torch

    return torch


def to_store(td: Any) -> Any:
    """A TensorDict's columns as ``Queue.put`` input (a TensorDict; the first batch dimension is the sample).

    Every tensor column whose samples are not 0-d is stored jagged (values + offsets), whether it was put jagged
    or dense: TransferQueue hands both back jagged, and one kind per field keeps a column writable both ways
    (persisting fixes a field's kind at its first put). A dense column becomes jagged without a copy."""
    from tensordict import NonTensorData, NonTensorStack, TensorDict

    torch = _torch()
    n = td.batch_size[0]
    out: dict[str, Any] = {}
    for name in td.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch dimension, not its keys)
        value = td.get(name)
        if isinstance(value, NonTensorStack | NonTensorData):
            out[name] = value
        elif isinstance(value, torch.Tensor) and value.is_nested:
            out[name] = value if value.layout == torch.jagged else NonTensorStack(*value.unbind())
        elif isinstance(value, torch.Tensor):
            out[name] = _dense_to_jagged(value.contiguous()) if value.dim() >= 2 and value.shape[1] > 0 else value
        elif hasattr(value, "batch_size") and hasattr(value, "keys"):
            raise ValueError(f"field {name!r} is a nested TensorDict: TransferQueue stores flat columns; flatten it")
        else:
            raise ValueError(f"field {name!r} holds a {type(value).__qualname__}, not a tensor or non-tensor stack")
    return TensorDict(out, batch_size=[n])


def _dense_to_jagged(t: Any) -> Any:
    """A dense (n, L, ...) tensor as a jagged nested tensor of n samples of (L, ...), sharing its memory."""
    torch = _torch()
    n, length = t.shape[0], t.shape[1]
    values = t.reshape(n * length, *t.shape[2:])
    offsets = torch.arange(0, (n + 1) * length, length, dtype=torch.int64)
    return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=length, max_seqlen=length)


def with_seqlens(nt: Any) -> Any:
    """The same jagged tensor (same memory) knowing its shortest and longest sample: without them torch's
    ``to_padded_tensor`` pads every sample to the length of all values together (n times too long)."""
    torch = _torch()
    if nt.layout != torch.jagged or nt._ragged_idx != 1 or nt._lengths is not None:
        return nt
    known = getattr(nt, "_metadata_cache", None) or {}
    if "min_seqlen" in known and "max_seqlen" in known:  # made so (persisting's reads): no second view to make
        return nt
    offsets = nt.offsets()
    lengths = offsets[1:] - offsets[:-1]
    if lengths.numel() == 0:
        return nt
    return torch.nested.nested_tensor_from_jagged(
        nt.values(), offsets, min_seqlen=int(lengths.min()), max_seqlen=int(lengths.max())
    )


def _pack(values: list[Any]) -> Any:
    from tensordict import NonTensorStack

    torch = _torch()
    values = [torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for v in values]
    if values and all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() == 0 for v in values):
            return torch.stack(values)
        try:
            return with_seqlens(torch.nested.as_nested_tensor(values, layout=torch.jagged))
        except (RuntimeError, TypeError):
            try:
                return torch.nested.as_nested_tensor(values, layout=torch.strided)
            except (RuntimeError, TypeError):
                return NonTensorStack(*values)
    return NonTensorStack(*values)


def column_out(value: Any) -> Any:
    """One column of ``get_data`` output as TransferQueue returns it."""
    torch = _torch()
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return with_seqlens(value)
        if value.dim() <= 1:
            return value
        if value.shape[1] == 0 or not value.is_contiguous():
            return _pack(list(value.unbind(0)))
        return _dense_to_jagged(value)
    return _pack(list(value))


def from_store(data: Mapping[str, Any], n: int, fields: list[str]) -> Any:
    """``get_data``'s fields as the TensorDict TransferQueue returns (columns in ``fields`` order)."""
    from tensordict import TensorDict

    return TensorDict({name: column_out(data[name]) for name in fields}, batch_size=[n])
