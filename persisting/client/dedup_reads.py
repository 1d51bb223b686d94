"""Reading deduped fields (tensors/dedup.py) through a ``Queue``: names the caller gives turned into references,
references turned back into each sample's value, a view of the one stored copy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..tensors import batches, dedup
from ..tensors.meta import BatchMeta, FieldMeta, sample_metas

if TYPE_CHECKING:
    from .topic_api import TopicAPI


async def named(topic: TopicAPI, fields: list[str] | None, mode: dedup.Mode) -> list[str] | None:
    """Field names as the caller gives them, a deduped field turned into its references: a field this Queue's
    ``dedup`` names, or one the topic stores deduped. A name this process has not seen yet refreshes the topic's
    fields first (another process put it since this one opened the topic); a consumer that asks for a deduped
    field by name before its first put is stored (``get_meta(fields, wait=True)``) must name it in its own
    ``Queue(dedup=[...])``, or ask for ``<name>@payload``."""
    if fields is None:
        return None
    await topic.refresh_kinds(fields)
    named = mode if isinstance(mode, frozenset) else frozenset()
    return [dedup.ref_field(f) if f in named else f for f in dedup.request_fields(fields, topic.kinds) or ()]


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
