"""Python objects as per-sample values of a tensor batch: ``NonTensorStack``/``NonTensorData`` entries and lists.

Values the record codec stores exactly (str, numbers, bytes, lists, tuples, dicts of those, numpy arrays and
torch tensors, nested freely: see ``wire/codec.py``) are stored as record values, readable by any Arrow reader.
Anything else (class instances, PIL images, dict subclasses, sets ...) needs pickle, which is opt-in per
``Queue``: ``Queue(..., objects="pickle")``. Then:

- a TensorDict's non-tensor entries (``NonTensorStack``, ``NonTensorData``) are always pickled, one pickle per
  sample (field kind ``object``), so a field keeps one kind whatever its values hold from batch to batch, and
  every value comes back exactly (types included);
- a plain list field is pickled when the codec cannot store one of its values, or when the topic already stores
  that field as ``object``.

Trust model (the persist-queue layer's, README "persist-queue compatibility"): pickling and unpickling happen
only in client processes (``dumps`` when a batch is put, ``load`` when it is read). The broker, the write-ahead
log and Lance hold the pickles as opaque bytes (``large_binary``); the broker never unpickles. Unpickling runs
code chosen by whoever wrote the pickle, so a Queue unpickles only with ``objects="pickle"``: without it, reading
an ``object`` field raises ``ConfigError``. Share pickled fields only between processes that trust each other
(the broker socket and arena are ``0600``, the service user's, by default).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, InvalidRecordError
from ..wire.codec import Pickled as Pickled  # the codec stores it; objects, dedup and the Queue look for it here

KIND = "object"
MODES = (None, "pickle")
PICKLE_PROTOCOL = 5


def check_mode(mode: Any) -> str | None:
    if mode not in MODES:
        raise ConfigError(f"objects must be None (no pickle: only values the codec stores) or 'pickle', got {mode!r}")
    return None if mode is None else str(mode)


def tensor_from_bytes(data: bytearray, dtype: str, shape: tuple[int, ...]) -> Any:
    """A CPU tensor from its bytes (what ``_reduce_tensor`` pickled): it owns them, as one torch unpickles.
    Stored pickles name this function: keep its module and name."""
    import torch

    kind = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(data, dtype=torch.uint8).view(kind).reshape(shape)


def _reduce_tensor(t: Any) -> Any:
    """A plain dense CPU tensor pickled as its dtype, shape and bytes: equal tensors give equal pickles (torch's
    own reduction names the storage by its address, so two equal tensors never pickle alike, and content dedup
    of ``multi_modal_inputs`` could not see them), and a view pickles only its own bytes, not its whole storage.
    Anything else (requiring grad, a view with strides, another device or layout) is pickled by torch."""
    import torch

    if t.layout != torch.strided or t.device.type != "cpu" or t.requires_grad or not t.is_contiguous():
        return t.__reduce_ex__(PICKLE_PROTOCOL)
    if t.is_quantized or t.is_conj() or t.is_neg() or any(n is not None for n in getattr(t, "names", ())):
        return t.__reduce_ex__(PICKLE_PROTOCOL)
    data = t.reshape(-1).view(torch.uint8).numpy()  # a view: written into the pickle once, not copied first
    return tensor_from_bytes, (pickle.PickleBuffer(data), str(t.dtype).removeprefix("torch."), tuple(t.shape))


_TABLE: dict[Any, Any] = {}  # made once torch is imported: copyreg's, plus plain tensors by their bytes
_LOCAL = threading.local()  # each thread's pickler and buffer, reused: a new pickler per value costs ~2 us


def _pickle(value: Any) -> bytes:
    torch = sys.modules.get("torch")  # a tensor in a value means torch is imported; else nothing to change
    if torch is None:
        return pickle.dumps(value, protocol=PICKLE_PROTOCOL)
    if torch.Tensor not in _TABLE:  # exact type: subclasses (Parameter ...) keep their own reduction
        _TABLE.update({**copyreg.dispatch_table, torch.Tensor: _reduce_tensor})
    mine = getattr(_LOCAL, "pickler", None)
    if mine is None:
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=PICKLE_PROTOCOL)
        pickler.dispatch_table = _TABLE
        mine = _LOCAL.pickler = (out, pickler)
    out, pickler = mine
    try:
        pickler.dump(value)
        return out.getvalue()
    finally:  # the memo holds what was pickled: let it go now, not at the next value
        pickler.clear_memo()
        out.seek(0)
        out.truncate()


def dumps(name: str, value: Any) -> Pickled:
    try:
        return Pickled(_pickle(value))
    except Exception as exc:
        what = type(value).__qualname__
        raise InvalidRecordError(f"field {name!r}: a value of type {what} cannot be pickled: {exc}") from exc


def prepare(
    values: Mapping[str, list[Any]],
    always: set[str],
    mode: str | None,
    known_kinds: Mapping[str, str],
    storable: Any,
) -> dict[str, list[Any]]:
    """The per-sample values of a batch with the fields to pickle pickled (``mode`` "pickle"): those in
    ``always`` (a TensorDict's non-tensor entries), those stored as ``object`` already, and those with a value
    ``storable(name, value)`` refuses. Without ``mode`` nothing is pickled (the codec refuses what it cannot
    store, and the message names ``objects='pickle'``)."""
    if mode != "pickle":
        return dict(values)
    out: dict[str, list[Any]] = {}
    for name, column in values.items():
        pickled = name in always or known_kinds.get(name) == KIND
        if not pickled:
            pickled = not all(v is None or storable(name, v) for v in column)
        out[name] = [None if v is None else dumps(name, v) for v in column] if pickled else list(column)
    return out


def load_all(data: dict[str, Any], allowed: bool) -> None:
    """Replace the ``Pickled`` values of a batch (field -> list of values) or record by the objects, in place;
    refused without ``objects="pickle"``."""
    for name, value in data.items():
        if isinstance(value, Pickled):
            data[name] = _load(name, value, allowed)
        elif isinstance(value, list) and any(isinstance(v, Pickled) for v in value):
            data[name] = [_load(name, v, allowed) if isinstance(v, Pickled) else v for v in value]


def _load(name: str, value: Pickled, allowed: bool) -> Any:
    if not allowed:
        raise ConfigError(
            f"field {name!r} holds pickled Python objects; open the Queue with objects='pickle' to load them "
            "(unpickling runs code chosen by whoever wrote them: only for producers you trust)"
        )
    try:
        return pickle.loads(value.data)
    except Exception as exc:
        raise InvalidRecordError(f"field {name!r}: a stored object cannot be unpickled here: {exc}") from exc
