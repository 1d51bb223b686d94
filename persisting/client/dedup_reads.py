"""Reading deduped fields (tensors/dedup.py) through a ``Queue``: names the caller gives turned into references,
references turned back into each sample's value, a view of the one stored copy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..engine import Topic
from ..tensors import batches, dedup
from ..tensors.meta import BatchMeta, FieldMeta, sample_metas
from .remote import RemoteTopic


async def named(topic: Topic | RemoteTopic, fields: list[str] | None) -> list[str] | None:
    """Field names as the caller gives them, a deduped field turned into its references; a name this process has
    not seen yet refreshes the topic's fields first (another process put it since this one opened the topic)."""
    if fields is None:
        return None
    if isinstance(topic, RemoteTopic) and any(f not in topic.kinds for f in fields):
        topic.kinds.update((await topic.stats()).get("fields", {}))
    return dedup.request_fields(fields, topic.kinds)


GetData = Callable[[BatchMeta, str | None, Any, bool], Awaitable[batches.Batch]]


async def resolve(data: batches.Batch, get_data: GetData, device: Any) -> batches.Batch:
    """``data`` with its deduped fields resolved: each sample's value from its one stored copy; ``get_data`` reads
    payload rows (``payloads=True``: without this resolution). What those hold is released with ``data``."""
    if not dedup.ref_fields(data):
        return data

    async def fetch(name: str, rows: list[int]) -> batches.Batch:
        meta = BatchMeta(tuple(sample_metas(rows, "", {name: FieldMeta(name, "")})), {"fields": [name]})
        return await get_data(meta, None, device, True)

    data.also(await dedup.resolve(data, fetch))
    return data
