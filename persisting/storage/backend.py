"""The storage backend protocol: where one bucket of a topic keeps its rows.

The ``Queue`` engine owns everything global (indexes, the write-ahead log, schema, ordering across buckets)
and hands each bucket's rows to one backend object. Any class with this shape can be passed as
``Queue(..., backend=MyBackend)`` (a class or any factory with the constructor's signature); check a backend
with the conformance suite, ``persisting.testing.backend_contract`` (docs: Guides, "Custom backends and the
contract suite").

The contract
------------
Construction
    ``MyBackend(bucket_id, storage_path, batch_size=100, **kwargs)``. ``storage_path`` is a folder that belongs to
    this topic; the backend may create ``bucket-<bucket_id>...`` entries in it and nothing else. Unknown
    ``kwargs`` must be accepted and ignored (forward compatibility). The constructor may do blocking I/O.

Rows
    A row is a dict with ``str`` keys whose values are ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``
    or ``bytes``. Keys may appear at any time (new columns); one key keeps one value type, ``None`` fits every
    key. The engine adds its own keys (prefix ``_persisting_``) and the backend stores them like any other.

Ordering and reads
    Rows have positions 0, 1, 2, ... in the order ``put``/``put_batch`` received them.
    ``get(limit, offset)`` returns the rows at positions ``offset .. offset+limit-1`` that exist, in order, each
    equal to what was put: same keys, same values, ``None`` kept, an absent key stays absent.
    ``get_stream`` yields the same rows as lists (batches), waiting for new rows when ``wait`` is true, for at
    most ``timeout`` seconds per wait. ``total_count()`` counts every row put, flushed or not.

Durability
    After ``flush()`` returns, every row put before it survives a kill -9 of the process and is read back by a
    new backend object constructed on the same ``storage_path``. A backend that cannot promise this sets the
    class attribute ``durable = False``; the engine then keeps its write-ahead log whole and replays it into the
    backend at every start (correct, but the log is never trimmed).

Concurrency
    The engine calls a backend from one event loop only. Calls may interleave at ``await`` points: a ``get`` of
    rows that a finished ``put_batch`` returned from must succeed while a later ``put_batch`` or ``flush`` is
    still running. Blocking I/O inside ``async`` methods should go to a thread (``asyncio.to_thread``).

Optional methods the engine uses when present
    ``async def read_column(name) -> list[int | None]``: one value per row, in position order (start-up reads
    the engine's index column this way instead of streaming whole rows).
    ``async def maintain() -> None``: housekeeping after a flush (compaction, cleanup of old versions).
    ``async def aclose() -> None``: release files and handles.
    ``async def repair_order() -> str``: put the stored rows back in increasing ``_persisting_index`` order in
    one atomic step and say what was done; the engine calls it at open when the index column it reads is not
    increasing (without it, such a bucket fails the open with ``CorruptionError``).
    ``async def get_described(limit, offset) -> list[Row]``: ``get``, except that a tensor value the backend
    can describe without reading it comes back as a ``Stored`` (kind, dtype name, shape), for ``get_meta``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Stored:
    """A dense tensor value left in storage: its kind, dtype name (as the decoded value names it) and shape.
    ``get_described`` returns it in place of the value; it lives here, beside the protocol, so that the engine can
    recognise it without importing a backend (the Lance one costs a broker-mode client ~0.5 s of import)."""

    kind: str
    dtype_name: str
    shape: tuple[int, ...]


@runtime_checkable
class StorageBackend(Protocol):
    """One bucket's row store. See the module docstring for the contract every method must keep."""

    def __init__(self, bucket_id: int, storage_path: str, batch_size: int = 100, **kwargs: Any) -> None: ...

    async def put(self, record: dict[str, Any]) -> None: ...

    async def put_batch(self, records: list[dict[str, Any]]) -> None: ...

    async def get(self, limit: int, offset: int) -> list[dict[str, Any]]: ...

    def get_stream(
        self, limit: int, offset: int, wait: bool = False, timeout: float | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]: ...

    async def flush(self) -> None: ...

    async def stats(self) -> dict[str, Any]: ...

    def total_count(self) -> int: ...


__all__ = ["Row", "StorageBackend", "Stored"]
