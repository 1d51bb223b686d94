"""Batches as they cross nodes through Ray's object store: numpy arrays only, and no copy to get there.

Ray stores numpy arrays out of band (pickle protocol 5): one copy into the object store of the node that returns
them, the transfer to the caller's node, and ``ray.get`` there gives read-only numpy views on that node's store.
A torch tensor would be pickled through its storage instead (an extra copy on each side), so CPU torch tensors
travel as their numpy views (bfloat16 as its 16-bit pattern) and are made torch tensors again on arrival, over
the same memory. A jagged nested tensor travels as its values (a numpy view, as above) and offsets and is rebuilt
on arrival with ``nested_tensor_from_jagged`` over them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..tensors.jagged import seqlen_bounds

_TORCH = "torch"
_BFLOAT16 = "bfloat16"
_JAGGED = "jagged:"  # + the values' kind: [values, offsets, jagged_dim]


def pack(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with every torch tensor (also inside lists) replaced by a numpy view; the second map names them."""
    out: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    for name, value in data.items():
        if _is_tensor(value) and getattr(value, "is_nested", False):
            values = value.values().contiguous()
            out[name] = [_as_numpy(values), _as_numpy(value.offsets()), int(value._ragged_idx)]
            kinds[name] = _JAGGED + _kind(values)
        elif isinstance(value, list) and value and _is_tensor(value[0]):
            out[name] = [_as_numpy(v) for v in value]
            kinds[name] = _kind(value[0])
        elif _is_tensor(value):
            out[name] = _as_numpy(value)
            kinds[name] = _kind(value)
        else:
            out[name] = value
    return out, kinds


def unpack(data: Mapping[str, Any], kinds: Mapping[str, str]) -> dict[str, Any]:
    """The inverse of ``pack``: torch fields made torch tensors again over the arrays' memory."""
    out = dict(data)
    for name, kind in kinds.items():
        value = out[name]
        if kind.startswith(_JAGGED):
            import torch

            values, offsets = _as_torch(value[0], kind[len(_JAGGED) :]), _as_torch(value[1], _TORCH)
            bounds = seqlen_bounds(value[1])
            out[name] = torch.nested.nested_tensor_from_jagged(values, offsets, jagged_dim=int(value[2]), **bounds)
            continue
        out[name] = [_as_torch(v, kind) for v in value] if isinstance(value, list) else _as_torch(value, kind)
    return out


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "numpy")


def _kind(tensor: Any) -> str:
    return _BFLOAT16 if str(tensor.dtype) == "torch.bfloat16" else _TORCH


def _as_numpy(tensor: Any) -> np.ndarray:
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # a CUDA tensor has to come to host memory once to travel anyway
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    result: np.ndarray = t.numpy()
    return result


def _as_torch(arr: np.ndarray, kind: str) -> Any:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # views on Ray's object store are read-only, as arena views are
        t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if kind == _BFLOAT16 else t


def pack_argument(
    args: tuple[Any, ...], kw: dict[str, Any], at: int, name: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kw`` with the batch argument (position ``at`` or keyword ``name``) packed, if given and not None."""
    if len(args) > at and args[at] is not None:
        return (*args[:at], pack(args[at]), *args[at + 1 :]), kw
    if kw.get(name) is not None:
        return args, {**kw, name: pack(kw[name])}
    return args, kw


def unpack_argument(
    args: tuple[Any, ...], kw: dict[str, Any], at: int, name: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inverse of ``pack_argument``."""
    if len(args) > at and args[at] is not None:
        return (*args[:at], unpack(*args[at]), *args[at + 1 :]), kw
    if kw.get(name) is not None:
        return args, {**kw, name: unpack(*kw[name])}
    return args, kw
