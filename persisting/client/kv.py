"""KVInterface: key-value access on top of a Queue, same in embedded and broker mode.

Every ``kv_put`` appends one record holding the key's whole current value (a partial update is merged with the
previous value first), its tag, and the key; ``kv_clear`` appends a tombstone. The value of a key is its latest
record: global indexes are assigned once and in order, so "latest" means the same thing in every process, and
clearing a key never touches what another key returns (Persisting 0.3.0 shifted indexes on clear and returned
the wrong row). Nothing is rewritten in place; old versions stay in the log of records.

Each process keeps a map ``(partition, key) -> global index`` and brings it up to date before every call by
reading the records appended since it last looked (so writes from other processes are seen). The map is built
by reading the topic once: KV topics are for keyed state (thousands of keys), not for bulk data.

The shapes are Persisting 0.3.0's, which its users' code indexes: ``kv_list`` gives ``(key, tag)`` pairs in
insertion order (``listed[0][0]`` is the first key), and ``kv_batch_get`` leaves out the keys that are not there
(``[]`` when none is); ``missing="none"`` keeps a ``None`` in their place, ``missing="raise"`` raises.

Reserved fields of a KV record: ``kv.key`` (str), ``kv.tag`` (any plain value) and ``kv.deleted`` (bool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .queue import Queue

KEY_FIELD = "kv.key"
TAG_FIELD = "kv.tag"
DELETED_FIELD = "kv.deleted"
_RESERVED = (KEY_FIELD, TAG_FIELD, DELETED_FIELD)
READ_PAGE = 10_000  # records read per request while catching up
# kv_batch_get's answers for a key that is not there: Persisting's (leave it out), a None in its place, KeyError.
# "skip" is "none"'s name before Persisting's shape became the default (kept so that code using it still runs).
MISSING = ("omit", "none", "raise", "skip")


class KVInterface:
    """Key-value access on top of a ``Queue`` (the seed's ``KVInterface``, with Persisting 0.3.0's shapes):
    ``kv_list`` gives ``(key, tag)`` pairs in insertion order, ``kv_batch_get`` gives no entry for a key that is
    not there. Every write is a put, so keys, values, tags and clears last as long as the topic does."""

    def __init__(self, queue: Queue) -> None:
        if not isinstance(queue, Queue):
            raise ConfigError(f"KVInterface wraps a persisting.Queue, got {type(queue).__qualname__}")
        self.queue = queue
        self._seen = 0  # records below this global index are in the map
        # (partition, key) -> (where the key was inserted, its latest record). An update keeps the key's place
        # (kv_list's insertion order, as a dict's); a key put again after a clear goes to the end.
        self._latest: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}

    async def _catch_up(self) -> None:
        while True:
            rows, end = await self.queue._read(READ_PAGE, self._seen)
            if end <= self._seen:
                return
            for n, record in enumerate(rows):
                key = record.get(KEY_FIELD)
                if isinstance(key, str):
                    at = (str(record.get("kv.partition", "default")), key)
                    previous = self._latest.get(at)
                    # Only the order matters: with no cleared rows this is the record's global index.
                    inserted = self._seen + n
                    if previous is not None and not previous[1].get(DELETED_FIELD):
                        inserted = previous[0]
                    self._latest[at] = (inserted, record)
            self._seen = end

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
        await self.kv_batch_put([key], [data], partition_id, None if tag is None else [tag])

    async def kv_batch_put(
        self,
        keys: Sequence[str],
        data: Sequence[Mapping[str, Any]],
        partition_id: str = "default",
        tags: Sequence[Any] | None = None,
    ) -> None:
        """Put each key's fields; an existing key is updated (fields not given keep their value), not added."""
        self._check(keys, partition_id)
        if len(data) != len(keys) or (tags is not None and len(tags) != len(keys)):
            raise ConfigError(f"{len(keys)} keys need as many data dicts (got {len(data)}) and tags")
        if len(set(keys)) != len(keys):
            raise ConfigError("a key appears twice in one kv_batch_put")
        await self._catch_up()
        records = []
        for n, (key, fields) in enumerate(zip(keys, data, strict=True)):
            if not isinstance(fields, Mapping) or any(f in _RESERVED or f == "kv.partition" for f in fields):
                raise ConfigError(f"the data of key {key!r} must be a dict without the fields {list(_RESERVED)}")
            previous = self._latest.get((partition_id, key))
            merged: dict[str, Any] = {}
            if previous is not None and not previous[1].get(DELETED_FIELD):
                merged = {k: v for k, v in previous[1].items() if k not in _RESERVED}
            merged.update(fields)
            tag = tags[n] if tags is not None else (previous[1].get(TAG_FIELD) if previous else None)
            merged.update({KEY_FIELD: key, TAG_FIELD: tag, DELETED_FIELD: False, "kv.partition": partition_id})
            records.append(merged)
        await self.queue.put_batch(records, partition_id=partition_id)
        await self._catch_up()

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
            found = self._latest.get((partition_id, key))
            if found is None or found[1].get(DELETED_FIELD):
                absent.append(key)
                if missing != "omit":
                    out.append(None)
                continue
            value = {k: v for k, v in found[1].items() if k not in _RESERVED and k != "kv.partition"}
            if fields is not None:
                value = {k: value[k] for k in fields if k in value}
            out.append(value)
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
            (key, record.get(TAG_FIELD))
            for (partition, key), (_inserted, record) in sorted(self._latest.items(), key=lambda kv: kv[1][0])
            if partition == partition_id and not record.get(DELETED_FIELD)
        ]

    async def kv_clear(self, keys: Sequence[str], partition_id: str = "default") -> None:
        """Remove keys (a tombstone each); other keys keep their values and indexes."""
        self._check(keys, partition_id)
        await self._catch_up()
        tombstones = [
            {KEY_FIELD: key, TAG_FIELD: None, DELETED_FIELD: True, "kv.partition": partition_id}
            for key in dict.fromkeys(keys)
            if (partition_id, key) in self._latest
        ]
        if tombstones:
            await self.queue.put_batch(tombstones, partition_id=partition_id)
            await self._catch_up()
