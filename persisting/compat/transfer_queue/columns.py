"""TransferQueue's columns in and out of persisting's tensor batches.

In: a TensorDict of ``n`` samples becomes ``put`` input: dense tensors as they are (one arena write in broker
mode), jagged ``torch.nested`` tensors as values + offsets where persisting stores them natively, else one tensor
per sample, ``NonTensorStack``/``NonTensorData`` as one Python value per sample.

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

KEY_FIELD = "_tq_key"  # the key of a sample, stored with it (the key index is rebuilt from the key log)


def _torch() -> Any:
    import torch

    return torch


def to_store(td: Any) -> dict[str, Any]:
    """A TensorDict's columns as ``Queue.put`` input (the first batch dimension is the sample)."""
    from tensordict import NonTensorData, NonTensorStack

    torch = _torch()
    n = td.batch_size[0]
    out: dict[str, Any] = {}
    for name in td.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch dimension, not its keys)
        if name == KEY_FIELD:
            raise ValueError(f"field name {KEY_FIELD!r} is reserved by persisting's TransferQueue layer")
        value = td.get(name)
        if isinstance(value, NonTensorStack):
            out[name] = list(value.tolist())
        elif isinstance(value, NonTensorData):
            out[name] = [value.data] * n
        elif isinstance(value, torch.Tensor) and value.is_nested:
            out[name] = list(value.unbind())
        elif isinstance(value, torch.Tensor):
            out[name] = value
        elif hasattr(value, "batch_size") and hasattr(value, "keys"):
            raise ValueError(f"field {name!r} is a nested TensorDict: TransferQueue stores flat columns; flatten it")
        else:
            raise ValueError(f"field {name!r} holds a {type(value).__qualname__}, not a tensor or non-tensor stack")
    return out


def _dense_to_jagged(t: Any) -> Any:
    """A dense (n, L, ...) tensor as a jagged nested tensor of n samples of (L, ...), sharing its memory."""
    torch = _torch()
    n, length = t.shape[0], t.shape[1]
    values = t.reshape(n * length, *t.shape[2:])
    offsets = torch.arange(0, (n + 1) * length, length, dtype=torch.int64)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _pack(values: list[Any]) -> Any:
    from tensordict import NonTensorStack

    torch = _torch()
    values = [torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for v in values]
    if values and all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() == 0 for v in values):
            return torch.stack(values)
        try:
            return torch.nested.as_nested_tensor(values, layout=torch.jagged)
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
            return value
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
