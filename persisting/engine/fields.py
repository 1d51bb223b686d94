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
    own      partition -> the id of each sample's own fields by position in the partition, as steps (runs.Steps):
             the samples of one put usually share their fields, so a put adds one step, not one id per sample
    sources  sample -> {field: global index of the patch row that wrote it last}
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..wire.codec import RESERVED_PREFIX
from .runs import Steps

ANY = 0  # the field-set id of rows stored before fields were recorded: every field counts as produced


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
        self._by_json: dict[str | bytes, int] = {}
        self.own: dict[str, Steps] = {}
        self._own_ids: dict[str, set[int]] = {}  # partition -> the field-set ids its samples were put with
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
        if not isinstance(raw, str | bytes):
            return self.intern(frozenset(json.loads(raw)))
        found = self._by_json.get(raw)
        if found is None:  # the rows of a bucket share a few field lists: parse each once, not once per row
            found = self._by_json[raw] = self.intern(frozenset(json.loads(raw)))
        return found

    def to_json(self, set_id: int) -> str | None:
        """The stored form of a field set (cached: a flush writes it once per row)."""
        if set_id == ANY:
            return None
        found = self._json.get(set_id)
        if found is None:
            found = self._json[set_id] = json.dumps(sorted(self.sets[set_id]))
        return found

    def rows_ids(self, rows: Sequence[dict[str, Any]], extra: tuple[str, ...] = ()) -> list[tuple[int, int]]:
        """The ids of stored rows' own fields as (count, id) runs. The rows of one put usually share their keys
        and hold no None: then one id for all, found with C-level passes over the rows (no Python per row)."""
        if not rows:
            return []
        if len(set(map(tuple, rows))) == 1 and None not in itertools.chain.from_iterable(map(dict.values, rows)):
            return [(len(rows), self.row_id(rows[0], extra))]
        out: list[tuple[int, int]] = []
        for set_id, same in itertools.groupby(self.row_id(row, extra) for row in rows):
            out.append((sum(1 for _ in same), set_id))
        return out

    def add(self, partition: str, ids: Sequence[int]) -> None:
        """New samples of ``partition`` (one id each), in the order their indexes were appended to the partition."""
        self.add_runs(partition, [(1, set_id) for set_id in ids])

    def add_runs(self, partition: str, runs: Iterable[tuple[int, int]]) -> None:
        """New samples of ``partition`` as (count, field-set id) runs, in order."""
        steps = self.own.get(partition)
        if steps is None:
            steps = self.own[partition] = Steps()
            self._own_ids[partition] = set()
        seen = self._own_ids[partition]
        for count, set_id in runs:
            steps.append(count, set_id)
            seen.add(set_id)

    def covers(self, partition: str, fields: frozenset[str]) -> bool:
        """Whether every sample of ``partition`` was put with all of ``fields`` (then none needs a look)."""
        sets = self.sets
        return all(i == ANY or fields <= sets[i] for i in self._own_ids.get(partition, ()))

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

    def ready_spans(self, partition: str, lo: int, hi: int, first: int, fields: frozenset[str]) -> list[list[int]]:
        """The positions in ``[lo, hi)`` of ``partition`` whose samples have every one of ``fields``, as
        ``[start, stop]`` spans; ``first`` is the global index at ``lo`` (the indexes there are consecutive).
        Samples sharing own fields that hold ``fields`` pass together; others are looked at one by one (only
        a patch can have written what they lack)."""
        out: list[list[int]] = []
        sources, sets = self.sources, self.sets
        for start, stop, set_id in self.own[partition].spans(lo, hi):
            own = sets[set_id]
            if set_id == ANY or fields <= own:
                if out and out[-1][1] == start:
                    out[-1][1] = stop
                else:
                    out.append([start, stop])
                continue
            if not sources:
                continue
            for p in range(start, stop):
                written = sources.get(first + p - lo)
                if written is not None and all(f in own or f in written for f in fields):
                    if out and out[-1][1] == p:
                        out[-1][1] = p + 1
                    else:
                        out.append([p, p + 1])
        return out

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
