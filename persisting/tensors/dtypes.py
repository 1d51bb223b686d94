"""The dtypes a tensor batch may hold and the kinds a field is put as: a leaf that ``column`` (dense fields) and
``jagged`` (ragged fields) both use, so neither imports the other for them.

A stored sample is plain bytes in a numpy dtype (``storage_dtype``); ``to_user`` gives it back as the kind it
was put as (``ndarray`` for numpy, ``tensor`` for torch, ``jagged`` for a ragged torch field). Importing this
module registers these with the codec (``TorchKinds``, ``wire/tensor_kinds.py``): the wire layer stores torch
tensors without importing tensors/.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InvalidRecordError
from ..wire import tensor_kinds

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it

JAGGED_KIND = "jagged"  # a torch field whose samples differ in one (ragged) dimension; see jagged.py

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


def storage_dtype(kind: str, dtype_name: str) -> np.dtype[Any]:
    """The numpy dtype whose bytes a stored sample holds; a name a peer sent is checked here."""
    if kind == "tensor" or kind == JAGGED_KIND:
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


def torch_to_host(t: Any) -> tuple[str, np.ndarray]:
    """A torch tensor's dtype name and its samples as a C-contiguous host array in the storage dtype (CUDA
    tensors are copied to the host; bfloat16 travels as int16)."""
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


class TorchKinds:
    """The codec's tensor kinds (``wire/tensor_kinds.py``): torch tensors and tensor-field samples, by the
    functions above. Registered on import, so the codec knows torch without importing this package."""

    def claims(self, value: Any) -> bool:
        return is_torch(value)

    def to_host(self, value: Any) -> tuple[str, np.ndarray]:
        return torch_to_host(value)

    def storage_dtype(self, kind: str, dtype_name: str) -> np.dtype[Any]:
        return storage_dtype(kind, dtype_name)

    def to_user(self, host: np.ndarray, kind: str, dtype_name: str) -> Any:
        return to_user(host, kind, dtype_name)


tensor_kinds.register(TorchKinds())
