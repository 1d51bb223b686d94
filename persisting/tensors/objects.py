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

import pickle
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, InvalidRecordError

KIND = "object"
MODES = (None, "pickle")
PICKLE_PROTOCOL = 5


class Pickled:
    """A pickled value: what the codec stores for kind ``object`` (its bytes), and what a read gives back before
    the Queue decides whether to load it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Pickled({len(self.data)} bytes)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pickled) and other.data == self.data

    __hash__ = None  # type: ignore[assignment]


def check_mode(mode: Any) -> str | None:
    if mode not in MODES:
        raise ConfigError(f"objects must be None (no pickle: only values the codec stores) or 'pickle', got {mode!r}")
    return None if mode is None else str(mode)


def dumps(name: str, value: Any) -> Pickled:
    try:
        return Pickled(pickle.dumps(value, protocol=PICKLE_PROTOCOL))
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
