"""``tensordict.TensorDict`` in and out of tensor batches (the optional ``tensordict`` extra).

In: ``put(td, partition_id=...)`` stores one sample per index of the TensorDict's first batch dimension. Nested
TensorDicts become fields named by their path joined with ``.`` (``td["obs", "pixels"]`` -> field
``obs.pixels``), so a key that itself holds a ``.`` is refused: it could not be told apart on the way back.
Non-tensor entries (``NonTensorStack``, e.g. a list of prompts) become per-sample values.

Out: ``get_data(..., as_tensordict=True)`` builds a TensorDict with ``batch_size=[samples]`` over the same arrays
``get_data`` returns (copy-on-write views of the broker's arena in broker mode: ``torch.from_numpy`` shares their
memory, so nothing is copied, writes stay the caller's, and the views are released when the tensors are
garbage-collected), nesting ``.`` paths again.
numpy fields come back as torch tensors (a TensorDict holds tensors). A TensorDict with more than one batch
dimension goes in sample by sample along the first; it comes back with ``batch_size=[samples]`` (the other batch
dimensions are part of each sample's shape: ``td.auto_batch_size_(batch_dims=2)`` restores them).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InvalidRecordError
from .column import is_torch

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it

SEPARATOR = "."


def flatten(td: Any, non_tensor: set[str] | None = None) -> dict[str, Any]:
    """The TensorDict's leaves as one flat mapping: tensors, and lists of per-sample values for non-tensors
    (whose names are added to ``non_tensor``)."""
    if len(td.batch_size) < 1:
        raise InvalidRecordError(
            "a TensorDict put as a tensor batch needs a batch dimension (batch_size=[n]): its samples are the "
            f"indexes of the first one; this one has batch_size={list(td.batch_size)}"
        )
    out: dict[str, Any] = {}
    _walk(td, (), out, set() if non_tensor is None else non_tensor)
    return out


def _walk(td: Any, path: tuple[str, ...], out: dict[str, Any], non_tensor: set[str]) -> None:
    from tensordict import is_non_tensor  # the caller holds a TensorDict: the package is there

    for key, value in td.items():
        if SEPARATOR in key:
            raise InvalidRecordError(
                f"TensorDict key {key!r} holds {SEPARATOR!r}, which joins the keys of nested TensorDicts into "
                "field names; rename it so that the batch comes back with the same keys"
            )
        name = SEPARATOR.join((*path, key))
        if is_torch(value):
            out[name] = value
        elif is_non_tensor(value):
            out[name] = _per_sample(value, int(td.batch_size[0]))  # NonTensorStack / NonTensorData
            non_tensor.add(name)
        elif hasattr(value, "batch_size") and callable(getattr(value, "items", None)):
            _walk(value, (*path, key), out, non_tensor)
        else:
            raise InvalidRecordError(f"TensorDict entry {name!r} holds a {type(value).__qualname__}")


def _per_sample(value: Any, n: int) -> list[Any]:
    """One value per sample of a NonTensorStack/NonTensorData along the batch's first dimension."""
    values = value.tolist()
    if len(value.batch_size) > 1:  # a stack over several batch dimensions: each sample holds the inner lists
        return list(values)
    if not isinstance(values, list) or len(values) != n:
        raise InvalidRecordError(f"a non-tensor entry gave {type(values).__qualname__} for {n} samples")
    return values


def to_tensordict(data: Mapping[str, Any], n: int) -> Any:
    """``get_data``'s fields as a TensorDict of ``n`` samples (no copy of tensor data)."""
    try:
        import torch
        from tensordict import TensorDict
    except ImportError as exc:
        raise ConfigError(
            "as_tensordict=True needs the tensordict package: the tensordict extra (in a checkout of persisting: "
            "pip install '.[tensordict]', after the CPU or CUDA torch you use)"
        ) from exc
    flat: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, np.ndarray):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only array: torch warns (ours are writable)
                value = torch.from_numpy(value)
        elif isinstance(value, list) and value and any(isinstance(v, np.ndarray) or is_torch(v) for v in value):
            raise ConfigError(
                f"field {name!r}: its samples have different shapes, which a TensorDict cannot hold in one entry; "
                "put such a field as a jagged nested tensor (layout=torch.jagged), or read it with "
                "as_tensordict=False (a list of samples)"
            )
        elif isinstance(value, list):
            value = _stack(value)
        flat[name] = value
    td = TensorDict(flat, batch_size=[n])
    return td.unflatten_keys(SEPARATOR) if any(SEPARATOR in name for name in flat) else td


def _stack(values: list[Any]) -> Any:
    """Per-sample values as a NonTensorStack (each value kept as it is: a dict is not read as a TensorDict)."""
    from tensordict import NonTensorData, NonTensorStack

    if not values:
        return values
    return NonTensorStack(*(NonTensorData(v) for v in values))
