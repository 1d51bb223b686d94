"""Per-field readiness: which fields of each sample are produced, and which row holds a field written later.

A sample is one row of the topic, written by one put; its *own* fields are those the put gave a value (not
``None``). More fields can be written for existing samples later, by ``put(data, partition_id,
batch_meta=meta)``: a *patch*. The log and the backends are append-only, so a patch's rows get global indexes of
their own and carry two engine columns: ``_persisting_of`` (the sample they add to) and ``_persisting_fields``
(the fields they write). Patch rows are not samples of any partition: ``get_meta`` never hands them out, and
``get_data`` of a sample reads each field from the latest row that wrote it (the sample itself or a patch), so a
field written twice reads back as its latest value. ``get()``/``stream()`` see patch rows as records.

Every row's own fields are stored in ``_persisting_fields`` too (a JSON list), so the index below is rebuilt at
open from three small columns, never from the payload. Rows written before this column existed have none: they
count as having every field (``ANY``).

State, built with the partition index on first use and kept up to date by every put::

    sets     interned frozensets of field names (id -> set; id 0 = ANY)
    own      partition -> list parallel to that partition's global indexes: the id of each sample's own fields
    sources  sample -> {field: global index of the patch row that wrote it last}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum
from typing import Any

from .codec import RESERVED_PREFIX

ANY = 0  # the field-set id of rows stored before fields were recorded: every field counts as produced


class ProductionStatus(IntEnum):
    """Whether a field of a sample has been written (TransferQueue's names)."""

    NOT_PRODUCED = 0
    READY_FOR_CONSUME = 1


def own_fields(row: Mapping[str, Any], extra: Iterable[str] = ()) -> frozenset[str]:
    """The fields a stored row gives a value (``extra``: tensor fields kept beside the row, in the arena)."""
    names = {k for k, v in row.items() if v is not None and not k.startswith(RESERVED_PREFIX)}
    names.update(extra)
    return frozenset(names)


class FieldIndex:
    def __init__(self) -> None:
        self.sets: list[frozenset[str]] = [frozenset()]
        self._ids: dict[frozenset[str], int] = {}
        self._json: dict[int, str] = {}
        self._by_keys: dict[tuple[str, ...], int] = {}
        self.own: dict[str, list[int]] = {}
        self.sources: dict[int, dict[str, int]] = {}

    def intern(self, names: frozenset[str]) -> int:
        found = self._ids.get(names)
        if found is None:
            found = self._ids[names] = len(self.sets)
            self.sets.append(names)
        return found

    def row_id(self, row: Mapping[str, Any], extra: tuple[str, ...] = ()) -> int:
        """The id of a stored row's own fields. Rows of one put usually share their keys and have no None, so
        the answer is cached by the keys: a flush and a put pay a tuple and a dict lookup per row."""
        if None in row.values():
            return self.intern(own_fields(row, extra))
        keys = (*row, *extra) if extra else tuple(row)
        found = self._by_keys.get(keys)
        if found is None:
            found = self._by_keys[keys] = self.intern(own_fields(row, extra))
        return found

    def intern_json(self, raw: Any) -> int:
        """The id of a stored ``_persisting_fields`` value (None: a row from before fields were recorded)."""
        if raw is None:
            return ANY
        return self.intern(frozenset(json.loads(raw)))

    def to_json(self, set_id: int) -> str | None:
        """The stored form of a field set (cached: a flush writes it once per row)."""
        if set_id == ANY:
            return None
        found = self._json.get(set_id)
        if found is None:
            found = self._json[set_id] = json.dumps(sorted(self.sets[set_id]))
        return found

    def add(self, partition: str, ids: Sequence[int]) -> None:
        """New samples of ``partition``, in the order their indexes were appended to the partition's list."""
        self.own.setdefault(partition, []).extend(ids)

    def patch(self, first: int, targets: Sequence[int], fields: Sequence[str]) -> None:
        """Rows ``first..`` wrote ``fields`` of ``targets`` (row ``first + k`` for ``targets[k]``)."""
        for k, target in enumerate(targets):
            slot = self.sources.setdefault(target, {})
            for name in fields:
                slot[name] = first + k

    def ready(self, partition: str, position: int, index: int, fields: frozenset[str]) -> bool:
        """Whether every one of ``fields`` is produced for the sample at ``position`` of ``partition``."""
        set_id = self.own[partition][position]
        if set_id == ANY:
            return True
        own = self.sets[set_id]
        if fields <= own:
            return True
        written = self.sources.get(index)
        return written is not None and all(f in own or f in written for f in fields)

    def produced(self, partition: str, position: int, index: int) -> frozenset[str] | None:
        """The fields produced for a sample (None: every field, a row from before fields were recorded)."""
        set_id = self.own[partition][position]
        if set_id == ANY:
            return None
        written = self.sources.get(index)
        return self.sets[set_id] if not written else self.sets[set_id] | written.keys()

    def source(self, index: int, name: str) -> int:
        """The global index of the row that holds field ``name`` of sample ``index``."""
        written = self.sources.get(index)
        if written is None:
            return index
        return written.get(name, index)
