"""KVInterface: key-value access on top of a Queue, same in embedded and broker mode.

Every write appends records that hold only what the call gave, and a key's value is the fold of its records in
global-index order. The engine assigns global indexes once and in order, so the log is the one order every process
agrees on, and every process folds it to the same value: two processes updating one key at once keep both's
fields, whichever lands first (this is "merge where the log is ordered"; nothing is merged from a process's own,
possibly stale, copy of the key). The records of a key, as they fold:

- a put (``kv.patch`` true): its fields update the key's value (fields not given keep theirs); its tag, if the
  call gave one (``kv.tag`` is then in the record, ``None`` included), replaces the key's tag, else the tag stays.
  Onto a key that is not there (never put, or cleared) it starts a fresh value: only its fields, its tag or None.
- a tombstone (``kv.deleted`` true, from ``kv_clear``): the key is gone; a put landing after it starts fresh, so a
  put that carried only other fields never brings back what a clear removed.
- a whole value (no ``kv.patch``: what earlier versions wrote, the key's merged value and tag on every put): it
  replaces the key's value and tag, so a store written before reads exactly as it did (the latest whole value,
  since nothing else is there to fold). Earlier versions read a patch as a whole value: downgrading is not supported.

Nothing is rewritten in place; old versions stay in the log of records. Clearing a key never touches what another
key returns (Persisting 0.3.0 shifted indexes on clear and returned the wrong row).

Each process keeps the folded values ``(partition, key) -> (insertion place, value, tag)`` and brings them up to
date before every read by folding the records appended since it last looked (so writes from other processes are
seen; one catch-up at a time, so records fold once and in order). Writes need no catch-up: a put carries only its
own fields and a clear always appends its tombstones (also for a key this process has not seen yet, so a put
landing just before it is cleared too). The values are built by reading the topic once: KV topics are for keyed
state (thousands of keys), not for bulk data.

The shapes are Persisting 0.3.0's, which its users' code indexes: ``kv_list`` gives ``(key, tag)`` pairs in
insertion order (``listed[0][0]`` is the first key), and ``kv_batch_get`` leaves out the keys that are not there
(``[]`` when none is); ``missing="none"`` keeps a ``None`` in their place, ``missing="raise"`` raises.

Reserved fields of a KV record: ``kv.key`` (str), ``kv.partition`` (str), ``kv.tag`` (any plain value),
``kv.deleted`` (bool) and ``kv.patch`` (bool).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .queue import Queue

KEY_FIELD = "kv.key"
TAG_FIELD = "kv.tag"
DELETED_FIELD = "kv.deleted"
PARTITION_FIELD = "kv.partition"
PATCH_FIELD = "kv.patch"
_RESERVED = (KEY_FIELD, TAG_FIELD, DELETED_FIELD, PARTITION_FIELD, PATCH_FIELD)
READ_PAGE = 10_000  # records read per request while catching up
# kv_batch_get's answers for a key that is not there: Persisting's (leave it out), a None in its place, KeyError.
# "skip" is "none"'s name before Persisting's shape became the default (kept so that code using it still runs).
MISSING = ("omit", "none", "raise", "skip")


class _Key:
    """A key's folded state: where it was inserted (kv_list's order), its value and its tag."""

    __slots__ = ("inserted", "tag", "value")

    def __init__(self, inserted: int, value: dict[str, Any], tag: Any) -> None:
        self.inserted, self.value, self.tag = inserted, value, tag


class KVInterface:
    """Key-value access on top of a ``Queue`` (the seed's ``KVInterface``, with Persisting 0.3.0's shapes):
    ``kv_list`` gives ``(key, tag)`` pairs in insertion order, ``kv_batch_get`` gives no entry for a key that is
    not there. Every write is a put, so keys, values, tags and clears last as long as the topic does; writers in
    several processes never undo each other's fields, tags or clears (a key is the fold of its records in the
    log's order)."""

    def __init__(self, queue: Queue) -> None:
        if not isinstance(queue, Queue):
            raise ConfigError(f"KVInterface wraps a persisting.Queue, got {type(queue).__qualname__}")
        self.queue = queue
        self._seen = 0  # records below this position are folded into _keys
        # (partition, key) -> its folded state, for the keys that are there (a tombstone removes the entry).
        self._keys: dict[tuple[str, str], _Key] = {}
        # Two catch-ups at once would fold one page twice, the second time over newer records.
        self._catching_up = asyncio.Lock()

    async def _catch_up(self) -> None:
        async with self._catching_up:
            while True:
                rows, end = await self.queue._read(READ_PAGE, self._seen)
                if end <= self._seen:
                    return
                for n, record in enumerate(rows):
                    # Only the order matters: with no cleared rows this is the record's global index.
                    self._fold(self._seen + n, record)
                self._seen = end

    def _fold(self, position: int, record: dict[str, Any]) -> None:
        key = record.get(KEY_FIELD)
        if not isinstance(key, str):
            return  # not a KV record
        at = (str(record.get(PARTITION_FIELD, "default")), key)
        if record.get(DELETED_FIELD):
            self._keys.pop(at, None)
            return
        fields = {k: v for k, v in record.items() if k not in _RESERVED}
        known = self._keys.get(at)
        if known is None:  # a fresh key, or one put again after a clear: inserted here (kv_list's order)
            self._keys[at] = _Key(position, fields, record.get(TAG_FIELD))
        elif record.get(PATCH_FIELD):
            known.value.update(fields)
            if TAG_FIELD in record:
                known.tag = record[TAG_FIELD]
        else:  # an earlier version's whole value: it is the value (an update keeps the key's place)
            known.value, known.tag = fields, record.get(TAG_FIELD)

    @staticmethod
    def _check(keys: Sequence[str], partition_id: str) -> None:
        if isinstance(keys, str):
            raise ConfigError("keys must be a list of str, not one str")
        bad = [k for k in keys if not isinstance(k, str) or not k]
        if bad:
            raise ConfigError(f"keys must be non-empty str, got {bad[:5]}")
        if not isinstance(partition_id, str) or not partition_id:
            raise ConfigError(f"partition_id must be a non-empty str, got {partition_id!r}")

    async def kv_put(self, key: str, data: Mapping[str, Any], partition_id: str = "default", tag: Any = None) -> None:
        """Put ``key``'s fields (see kv_batch_put); ``tag=None`` leaves the key's tag as it is."""
        await self.kv_batch_put([key], [data], partition_id, None if tag is None else [tag])

    async def kv_batch_put(
        self,
        keys: Sequence[str],
        data: Sequence[Mapping[str, Any]],
        partition_id: str = "default",
        tags: Sequence[Any] | None = None,
    ) -> None:
        """Put each key's fields; an existing key is updated (fields not given keep their value), not added.

        ``tags`` (one per key) replace the keys' tags, a None in it included; without ``tags`` each key keeps its
        tag (a new key, or one put again after a clear, has None). Writes from other processes are never undone:
        only the fields given are written, and the log's order decides between two writes of one field."""
        self._check(keys, partition_id)
        if len(data) != len(keys) or (tags is not None and len(tags) != len(keys)):
            raise ConfigError(f"{len(keys)} keys need as many data dicts (got {len(data)}) and tags")
        if len(set(keys)) != len(keys):
            raise ConfigError("a key appears twice in one kv_batch_put")
        records = []
        for n, (key, fields) in enumerate(zip(keys, data, strict=True)):
            if not isinstance(fields, Mapping) or any(f in _RESERVED for f in fields):
                raise ConfigError(f"the data of key {key!r} must be a dict without the fields {list(_RESERVED)}")
            record = {**fields, KEY_FIELD: key, PARTITION_FIELD: partition_id, PATCH_FIELD: True}
            if tags is not None:
                record[TAG_FIELD] = tags[n]
            records.append(record)
        await self.queue.put_batch(records, partition_id=partition_id)

    async def kv_batch_get(
        self,
        keys: Sequence[str],
        partition_id: str = "default",
        fields: Sequence[str] | None = None,
        missing: str = "omit",
    ) -> list[dict[str, Any] | None]:
        """The current value of each key that is there, in the order of ``keys`` (only ``fields`` if given).

        A key never put, or cleared, has no entry (``[]`` when no key is there), as in Persisting 0.3.0; then the
        result no longer lines up with ``keys``. ``missing="none"`` puts None in its place instead (``"skip"``,
        its earlier name, too), ``missing="raise"`` raises KeyError naming the missing keys."""
        self._check(keys, partition_id)
        if missing not in MISSING:
            raise ConfigError(f"missing must be one of {list(MISSING)}, got {missing!r}")
        await self._catch_up()
        out: list[dict[str, Any] | None] = []
        absent = []
        for key in keys:
            found = self._keys.get((partition_id, key))
            if found is None:
                absent.append(key)
                if missing != "omit":
                    out.append(None)
                continue
            if fields is None:
                out.append(dict(found.value))
            else:
                out.append({k: found.value[k] for k in fields if k in found.value})
        if absent and missing == "raise":
            raise KeyError(f"no such keys in partition {partition_id!r}: {absent[:10]}")
        return out

    async def kv_list(self, partition_id: str = "default") -> list[tuple[str, Any]]:
        """``(key, tag)`` of every current key of the partition, in insertion order (Persisting 0.3.0's shape:
        ``listed[0][0]`` is the first key put). An update keeps a key's place; a key cleared and put again comes
        last. ``dict(listed)`` gives key -> tag."""
        self._check([], partition_id)
        await self._catch_up()
        return [
            (key, found.tag)
            for (partition, key), found in sorted(self._keys.items(), key=lambda kv: kv[1].inserted)
            if partition == partition_id
        ]

    async def kv_clear(self, keys: Sequence[str], partition_id: str = "default") -> None:
        """Remove keys: a tombstone each (also for a key this process has not seen: another process may have put
        it just before); other keys keep their values and indexes. A put landing after it starts the key fresh."""
        self._check(keys, partition_id)
        tombstones = [
            {KEY_FIELD: key, TAG_FIELD: None, DELETED_FIELD: True, PARTITION_FIELD: partition_id}
            for key in dict.fromkeys(keys)
        ]
        if tombstones:
            await self.queue.put_batch(tombstones, partition_id=partition_id)
