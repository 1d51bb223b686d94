"""The tensor kinds the codec stores, as an interface that ``persisting/tensors`` fills in.

The codec stores numpy values by itself, but a ``tensor`` value (a torch tensor) and the samples of tensor-batch
fields (kinds ``ndarray``, ``tensor``, ``jagged``) need to know torch's dtypes and how a host array becomes a
tensor again. That knowledge lives in ``persisting/tensors/dtypes.py``, above the wire layer: it registers itself
here when it is imported (``import persisting`` does), so the wire layer never imports a tensors module.

Contract of a ``TensorKinds`` (one is registered per process; a second registration replaces the first):

- ``claims(value)``: True for a value the codec stores as kind ``tensor``; it must not import torch (a value
  can only be a tensor once something imported torch).
- ``to_host(value)``: ``(dtype name, C-contiguous host array in the storage dtype)`` of such a value, on the CPU;
  ``InvalidRecordError`` for a dtype that cannot be stored.
- ``storage_dtype(kind, dtype_name)``: the numpy dtype whose bytes a stored sample of a tensor-field ``kind``
  holds; ``InvalidRecordError`` for a kind or dtype name it does not know (names come from peers: checked here).
- ``to_user(host, kind, dtype_name)``: the host array as the kind it was put as (a torch tensor sharing its
  memory for ``tensor``; the array itself for ``ndarray``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError

if TYPE_CHECKING:
    import numpy as np


class TensorKinds(Protocol):
    """What the codec asks of the tensor layer (contract in the module docstring)."""

    def claims(self, value: Any) -> bool: ...

    def to_host(self, value: Any) -> tuple[str, np.ndarray]: ...

    def storage_dtype(self, kind: str, dtype_name: str) -> np.dtype[Any]: ...

    def to_user(self, host: np.ndarray, kind: str, dtype_name: str) -> Any: ...


_registered: list[TensorKinds] = []  # at most one: the list lets the hot path test it without a global statement


def register(kinds: TensorKinds) -> None:
    """Make ``kinds`` the tensor kinds the codec uses (``persisting/tensors/dtypes.py`` calls this on import)."""
    _registered[:] = [kinds]


def claims(value: Any) -> bool:
    """Whether ``value`` is a tensor the registered kinds store (False while none is registered: then no tensor
    code was loaded, and no value the user holds can be one of ours)."""
    return bool(_registered) and _registered[0].claims(value)


def registered() -> TensorKinds:
    """The registered tensor kinds; ``ConfigError`` when none is (a process that decodes a tensor field without
    having imported ``persisting``, e.g. a tool importing ``persisting.wire.codec`` alone)."""
    if not _registered:
        raise ConfigError(
            "no tensor kinds are registered with the codec, so a tensor value cannot be encoded or decoded; "
            "import persisting (or persisting.tensors.dtypes) first"
        )
    return _registered[0]
