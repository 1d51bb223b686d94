"""Rows that arrived from outside (a client's put on the broker's wire), checked against what ``codec.encode_batch``
produces before anything is stored: a client that skipped or bypassed encoding gets a clear ``InvalidRecordError``
here instead of a flush that fails later. One pass over the rows with a type per key decided once per batch; a row
that does not fit it goes to the slow check, which words the error."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRecordError
from .codec import INT64_MAX, INT64_MIN, RESERVED_PREFIX

_STORAGE_TYPES: dict[str, type] = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "bytes": bytes,
    "nested": bytes,
    "ndarray": bytes,
    "tensor": bytes,
    "jagged": bytes,
    "object": bytes,
}


class _NoneOnly:
    """The expected type of a field seen only as None in this batch: any other value takes the slow path."""


def check_rows(rows: Any, kinds: Mapping[str, str], count: int) -> list[dict[str, Any]]:
    """Validate rows that arrived from outside (the broker's wire): the shapes encode_batch would produce.

    A client that skipped or bypassed encoding gets a clear error here instead of a flush that fails later.
    """
    if not isinstance(rows, list) or len(rows) != count:
        raise InvalidRecordError(f"expected a list of {count} rows")
    shared = expected = _expected.of(kinds)
    if rows.count({}) == count:
        # Every row empty (a tensor batch with no other fields: each arena put of tensors only): valid whatever
        # the kinds, counted in C instead of a Python loop over the rows (256 rows: ~30 us of a put_tensors).
        return rows
    for n, row in enumerate(rows):
        if type(row) is dict:
            for key, value in row.items():
                want = expected.get(key)
                if want is None:
                    break
                if value is None:
                    continue
                if type(value) is not want or (want is int and not INT64_MIN <= value <= INT64_MAX):
                    break
            else:
                continue
        _check_row(n, row, kinds)
        # The row is valid after all: a valid key that held None and has no kind now passes the fast path (in a
        # copy: the kept types are the kinds' own).
        if expected is shared:
            expected = dict(shared)
        for key, value in row.items():
            if value is None:
                expected.setdefault(key, _NoneOnly)
    return rows


class _Expected:
    """The storage type per key of ``kinds``; only valid keys get one, so an invalid key (or a value of the wrong
    type) falls to _check_row, which finds the problem and words the error. A producer sends the same kinds put
    after put: the last kinds' types are kept (checked once, not per batch)."""

    __slots__ = ("_kinds", "_types")

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}
        self._types: dict[str, Any] = {}  # Any: mypy would narrow a value checked against a type to object

    def of(self, kinds: Mapping[str, str]) -> dict[str, Any]:
        if type(kinds) is dict and kinds == self._kinds:
            return self._types
        types: dict[str, Any] = {}
        for key, kind in kinds.items():
            if not isinstance(kind, str) or kind not in _STORAGE_TYPES or not isinstance(key, str):
                raise InvalidRecordError(f"unknown kind {kind!r} for field {key!r}")
            if key and not key.startswith(RESERVED_PREFIX):
                types[key] = _STORAGE_TYPES[kind]
        self._kinds, self._types = dict(kinds), types
        return types


_expected = _Expected()


def _check_row(n: int, row: Any, kinds: Mapping[str, str]) -> None:
    if not isinstance(row, dict):
        raise InvalidRecordError(f"row {n} is not a map")
    for key, value in row.items():
        if not isinstance(key, str) or not key or key.startswith(RESERVED_PREFIX):
            raise InvalidRecordError(f"row {n} has an invalid key {key!r}")
        if value is None:
            continue
        declared = kinds.get(key)
        if declared is None or type(value) is not _STORAGE_TYPES[declared]:
            raise InvalidRecordError(
                f"row {n}: field {key!r} holds {type(value).__name__}, its declared kind is {declared!r}"
            )
        if declared == "int" and isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            raise InvalidRecordError(f"row {n}: field {key!r} is outside the 64-bit range")
