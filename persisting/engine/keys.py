"""Keys of samples: which sample each ``(partition, key)`` names, kept by the engine (``Queue.kv_*``).

Contract (``Topic.keys``, a ``KeyIndex``; every method on the engine's loop):

- A key names at most one live sample of its partition. The sample's own row carries the key in the engine column
  ``KEY_COLUMN``, written in the same log frame as the sample's data: a crash never leaves a key naming nothing or
  a new sample without its key, and nothing but the rows is stored. The map here is derived from them: built on
  first use from the backends' ``KEY_COLUMN`` and the tail's rows (what the log replayed), less the cleared
  samples, so a restart finds every key without a checkpoint, and a cleared key costs nothing once its row is
  purged. No process replays anything: the map lives where the engine runs (the broker, or the embedded Queue).
- ``put``: keys that name no sample become new samples (their rows carry the key); keys that do get the fields as
  a patch (``Topic.append(of=)``: the latest write of a field wins, other fields stay); then the tags are merged
  (``set_tags``: ``dict.update``). One call, whatever the mix; keys being created by a call in flight are waited
  for (the second call then writes to the first one's samples), so two creators never make two samples.
- Tags go to the consumption log after the data's frame is acknowledged: a crash between the two loses the tags
  of a put that was never acknowledged; its retry (same idempotency key) stores the data once and the tags.
- ``clear``: the samples are cleared (logged durably before it returns), then the keys are forgotten; the same
  key put again makes a new sample (with no tags), as TransferQueue does.
- ``listing``: a partition is listed from its first key on. Once ``clear`` took its every key it stays listed
  (empty) until a restart; once the whole partition was cleared (``Topic.clear`` with no indexes: TransferQueue's
  ``clear_partition``) it is gone at once, as TransferQueue drops a cleared partition (``partition_cleared``). The
  map built at a restart lists only partitions with a live key, so neither comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import xxhash

from ..errors import ConfigError
from ..wire.codec import INDEX_KEY, OF_KEY, PARTITION_KEY, RESERVED_PREFIX, EncodedBatch, pack
from .args import check_keys
from .buckets import Buckets
from .partitions import Clears
from .tail import ArenaPayload, Tail

KEY_COLUMN = RESERVED_PREFIX + "key"  # the key of a sample, in its own row


def key_rows_key(key: str) -> str:
    """The idempotency key of the rows a put keyed ``key`` stores for its new keys: a digest (as the client's
    ``dedup.payload_key``), so that no key a user gives names it by accident (``key + ".keys"`` did: a put keyed
    ``"s.keys"`` made a later ``kv_put`` keyed ``"s"`` point its new keys at that put's samples), and short
    whatever the length of ``key``."""
    return "keys-" + xxhash.xxh3_128_hexdigest(key.encode("utf-8", "surrogatepass"))


Append = Callable[..., Awaitable[tuple[int, int]]]


class KeyIndex:
    def __init__(
        self,
        buckets: Buckets,
        tail: Tail,
        clears: Clears,
        flush_lock: asyncio.Lock,
        append: Append,
        clear: Callable[[str, list[int]], Awaitable[int]],
    ) -> None:
        self._buckets = buckets
        self._tail = tail
        self._clears = clears
        self._flush_lock = flush_lock
        self._append = append  # Topic.append
        self._clear = clear  # Topic.clear
        self._keys: dict[str, dict[str, int]] | None = None  # partition -> key -> sample (creation order)
        self._names: dict[int, str] = {}  # sample -> its key
        self._pending: dict[tuple[str, str], asyncio.Future[None]] = {}  # keys a call in flight is creating

    # -- the map ------------------------------------------------------------------------------------

    async def _ready(self) -> dict[str, dict[str, int]]:
        if self._keys is None:
            async with self._flush_lock:  # the backends and the tail hold disjoint rows while this reads
                if self._keys is None:
                    self._keys = await self._build()
        return self._keys

    async def _build(self) -> dict[str, dict[str, int]]:
        found: list[tuple[int, str, str]] = []
        for indexes, parts, targets, names in await self._buckets.columns(INDEX_KEY, PARTITION_KEY, OF_KEY, KEY_COLUMN):
            for index, part, of, name in zip(indexes, parts, targets, names, strict=True):
                if of is None and isinstance(name, str):
                    found.append((int(index), str(part), name))
        for chunk in self._tail.chunks:
            if chunk.of is None:
                for i, row in enumerate(chunk.other):
                    name = row.get(KEY_COLUMN)
                    if isinstance(name, str):
                        found.append((chunk.first + i, chunk.partition, name))
        cleared = self._clears.cleared
        keys: dict[str, dict[str, int]] = {}
        for index, part, name in sorted(found):
            if index in cleared:  # a partition whose keys were all cleared is not listed (see listing)
                continue
            named = keys.setdefault(part, {})
            if name not in named:  # the oldest live sample wins (one, see put)
                named[name] = index
                self._names[index] = name
        return keys

    async def _settled(self, partition: str, keys: list[str]) -> dict[str, int]:
        """The partition's map (empty if it has none yet) once no call in flight is creating one of ``keys``, less
        the keys whose sample was cleared some other way (``Topic.clear`` by index, or of the whole partition)."""
        while True:
            waits = [f for k in keys if (f := self._pending.get((partition, k))) is not None]
            if not waits:
                break
            await asyncio.wait(waits)
        named = (await self._ready()).get(partition, {})
        cleared = self._clears.cleared
        for k in keys:
            i = named.get(k)
            if i is not None and i in cleared:
                del named[k]
                self._names.pop(i, None)
        return named

    async def lookup(self, partition: str, keys: list[str]) -> list[int | None]:
        """The sample each key names (None: none)."""
        named = await self._settled(partition, check_keys(keys))
        return [named.get(k) for k in keys]

    async def names(self, partition: str, indexes: list[int]) -> list[str | None]:
        """The key each sample of ``partition`` carries (None: none, or it was cleared)."""
        named = (await self._ready()).get(partition, {})
        out: list[str | None] = []
        for i in indexes:
            name = self._names.get(int(i))
            live = name is not None and named.get(name) == int(i) and int(i) not in self._clears.cleared
            out.append(name if live else None)
        return out

    async def listing(self, partition: str | None) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tags}}`` of every key (of ``partition`` only if given), keys in creation order; a
        partition that had keys stays listed (empty) once they are cleared, until a restart, unless the whole
        partition was cleared (``partition_cleared``)."""
        keys = await self._ready()
        tags, cleared = self._clears.tags, self._clears.cleared
        chosen = keys if partition is None else {p: v for p, v in keys.items() if p == partition}
        return {
            p: {k: dict(tags.get(i) or {}) for k, i in named.items() if i not in cleared} for p, named in chosen.items()
        }

    def partition_cleared(self, partition: str) -> None:
        """Every sample of ``partition`` was cleared (``Topic.clear`` with no indexes): it leaves the listing, as
        TransferQueue's ``clear_partition`` drops the partition, unless a key made since names a live sample."""
        if self._keys is None:
            return  # the map, built on first use, lists no partition without a live key
        named = self._keys.get(partition)
        if named is None:
            return
        cleared = self._clears.cleared
        for k, i in list(named.items()):
            if i in cleared:
                del named[k]
                self._names.pop(i, None)
        if not named:
            del self._keys[partition]

    # -- writes -------------------------------------------------------------------------------------

    async def put(
        self,
        partition: str,
        keys: list[str],
        tags: list[dict[str, Any]] | None = None,
        batch: EncodedBatch | None = None,
        rows_blob: bytes | None = None,
        key: str | None = None,
        arena: ArenaPayload | None = None,
    ) -> tuple[int, int, list[int]]:
        """Write ``batch`` (row k: the fields of ``keys[k]``; None: tags only) and merge ``tags``; returns the data
        append's (first, count) (the rows it stored, (0, 0) if none) and the sample each key names."""
        keys = check_keys(keys, tags)
        if batch is not None and len(batch.rows) != len(keys):
            raise ConfigError(f"{len(keys)} keys need as many rows, got {len(batch.rows)}")
        named = await self._settled(partition, keys)
        indexes: list[int | None] = [named.get(k) for k in keys]
        new = [n for n, i in enumerate(indexes) if i is None]
        done = asyncio.get_running_loop().create_future()
        for n in new:
            self._pending[(partition, keys[n])] = done
        try:
            first, count = 0, 0
            has_fields = batch is not None and (bool(batch.kinds) or arena is not None)
            if has_fields and batch is not None and len(new) == len(keys):
                # Every key new: one frame holds the data and the keys.
                for row, name in zip(batch.rows, keys, strict=True):
                    row[KEY_COLUMN] = name
                first, count = await self._append(batch, partition, pack(batch.rows), key, arena)
                indexes = list(range(first, first + count))
            else:
                if new:  # samples holding only their key; the fields (if any) follow as a patch
                    rows = [{KEY_COLUMN: keys[n]} for n in new]
                    made, _ = await self._append(
                        EncodedBatch(rows, {}), partition, pack(rows), None if key is None else key_rows_key(key)
                    )
                    for j, n in enumerate(new):
                        indexes[n] = made + j
                if has_fields and batch is not None and rows_blob is not None:
                    targets = [int(i) for i in indexes if i is not None]
                    first, count = await self._append(batch, partition, rows_blob, key, arena, targets)
            if new:  # a partition is listed from its first key on, also once its keys are cleared
                named = (await self._ready()).setdefault(partition, {})
            for n in new:
                i = indexes[n]
                if i is not None:
                    named[keys[n]] = i
                    self._names[i] = keys[n]
        finally:
            for n in new:
                self._pending.pop((partition, keys[n]), None)
            done.set_result(None)
        out = [int(i) for i in indexes if i is not None]
        if tags is not None:
            items = [(i, dict(t)) for i, t in zip(out, tags, strict=True) if t]
            if items:
                await self._clears.set_tags(partition, items)
        return first, count, out

    async def clear(self, partition: str, keys: list[str]) -> int:
        """Clear the samples ``keys`` name (keys naming none are skipped); returns how many were cleared."""
        named = await self._settled(partition, check_keys(list(dict.fromkeys(keys))))
        pairs = [(k, i) for k in dict.fromkeys(keys) if (i := named.get(k)) is not None]
        if not pairs:
            return 0
        # The clear is logged before it returns; the map follows (it is rebuilt from the rows and the clears).
        cleared = await self._clear(partition, [i for _, i in pairs])
        for k, i in pairs:
            if named.get(k) == i:
                del named[k]
                self._names.pop(i, None)
        return cleared
