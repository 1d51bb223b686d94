"""The key index: which sample (global index of the data topic) each (partition, key) names now.

The truth is a log of records in its own topic (``<name>.keys``), appended through the broker like any put,
so it is durable, ordered and the same for every process: ``{"p": partition, "k": key, "i": index, "op":
"new"|"del"}``. Each process keeps the map the log gives and reads only what was appended since it last looked
(``catch_up``), so a key written by another process is seen by the next call here. A catch-up costs one request
(a page shorter than ``READ_PAGE`` is the end), and appending costs none more when nothing else was appended since
(the records appended are then the log's next ones, applied here as written).

Creating a key is not a read-modify-write of shared state: the creator stores the sample first, then appends a
``new`` record naming it. If two processes create the same key at once, both records land in some order, and
the first one after the key's last ``del`` wins in every process (records naming a key that exists are
ignored). The loser sees that on its next catch-up, clears the sample it made and uses the winner's; so no
acknowledged write is lost and every process agrees.
"""

from __future__ import annotations

from typing import Any

from persisting import Queue

from .. import _engine

READ_PAGE = 10_000  # key-log records read per request while catching up


class KeyIndex:
    def __init__(self, log: Queue) -> None:
        self.log = log
        self._seen = 0
        self._index: dict[str, dict[str, int]] = {}  # partition -> key -> global index (insertion: creation order)
        self._keys: dict[str, dict[int, str]] = {}  # partition -> global index -> key

    async def catch_up(self) -> None:
        while True:
            start = self._seen
            rows, end = await _engine.read_window(self.log, READ_PAGE, start)
            for row in rows:
                self._apply(row)
            # max: an append of this process applied its own records meanwhile (replaying them is harmless)
            self._seen = max(self._seen, end)
            # A window ends short of its page only at the end of what is visible: no second request to learn that.
            if end - start < READ_PAGE:
                return

    async def _append(self, records: list[dict[str, Any]]) -> None:
        """Append ``records`` to the log and bring the map up to date. When nothing was appended by another
        process since our last look, our own records are the log's next ones: applied here, with no read."""
        placed = await self.log.put_batch(records, partition_id="keys")
        if placed.start == self._seen:
            for row in records:
                self._apply(row)
            self._seen = placed.stop
        else:
            await self.catch_up()

    def _apply(self, row: dict[str, Any]) -> None:
        p, k, i, op = row.get("p"), row.get("k"), row.get("i"), row.get("op")
        if not isinstance(p, str) or not isinstance(k, str) or not isinstance(i, int):
            return
        keys = self._index.setdefault(p, {})
        back = self._keys.setdefault(p, {})
        if op == "new":
            if k not in keys:  # the first creation after the last clear wins
                keys[k] = i
                back[i] = k
        elif op == "del" and keys.get(k) == i:
            del keys[k]
            back.pop(i, None)

    def get(self, partition: str, key: str) -> int | None:
        return self._index.get(partition, {}).get(key)

    def key_of(self, partition: str, index: int) -> str | None:
        return self._keys.get(partition, {}).get(index)

    def partitions(self) -> list[str]:
        return list(self._index)

    def items(self, partition: str) -> list[tuple[str, int]]:
        return list(self._index.get(partition, {}).items())

    async def add(self, partition: str, keys: list[str], indexes: list[int]) -> list[int]:
        """Log the creation of ``keys`` as ``indexes``; returns the index each key names now (another process's
        when it created the key first)."""
        await self._append([{"p": partition, "k": k, "i": i, "op": "new"} for k, i in zip(keys, indexes, strict=True)])
        out = []
        for k in keys:
            now = self.get(partition, k)
            if now is None:  # cleared by another process right after we created it: ours is gone too
                raise KeyError(f"key {k!r} of partition {partition!r} was cleared while it was being created")
            out.append(now)
        return out

    async def remove(self, partition: str, pairs: list[tuple[str, int]]) -> None:
        if pairs:
            await self._append([{"p": partition, "k": k, "i": i, "op": "del"} for k, i in pairs])

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {p: dict(keys) for p, keys in self._index.items()}
