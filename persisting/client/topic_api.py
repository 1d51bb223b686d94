"""The one interface the client drives a topic through, embedded or over a broker: ``TopicAPI`` and ``KeysAPI``.

``handle.TopicHandle`` opens one of the two kinds and hands it out as a ``TopicAPI``; every other client module
(queue, data API, tensor puts, big batches, keyed samples, the compat layers) calls these methods without asking
which kind it holds. The two implementations:

- ``embedded.EmbeddedTopic``: the engine's ``engine.Topic`` in this process, run on the engine loop
  (``_loop.py``); a method's coroutine hops there, so it may be awaited from any loop.
- ``remote.RemoteTopic``: a broker's topic, one request per call over the process's connection
  (``connection.py``), run on the caller's loop; tensor batches through the broker's shared memory
  (``remote_tensors.ArenaClient``).

Contract, for every method below unless it says otherwise: ``async`` methods are awaited on the caller's loop;
arguments are already checked by the caller (``data_args.py``, ``Queue``), except where a method says it checks;
errors are ``persisting.errors`` ones, the same in both modes (the broker sends the engine's errors back as the
same classes); over a broker a lost connection raises ``BrokerUnavailableError`` after the connection's
re-sends. "Descriptions" are ``engine.Topic.describe``'s run-length encoded field descriptions of samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..engine import TopicConfig
    from ..tensors.batches import Batch
    from ..wire.codec import EncodedBatch
    from .remote_tensors import ArenaClient

Described = tuple[list[int], list[list[Any]]]  # samples' global indexes and their descriptions
# kv_get's answer: each key's sample (None: no such key), descriptions of those found, the fields read, their
# data (None: nothing to read), bytes handed over as views, bytes copied
KeysRead = tuple[list[int | None], list[list[Any]], list[str], "Batch | None", int, int]


@runtime_checkable
class KeysAPI(Protocol):
    """Keyed samples of a topic (``Queue.kv_*``; the engine's key index, ``engine/keys.py``, is the contract of
    what a key names). Embedded: the engine's index on the engine loop; over a broker: one request per call."""

    async def put(
        self,
        partition: str,
        keys: list[str],
        tags: list[dict[str, Any]] | None,
        batch: EncodedBatch | None,
        blob: bytes | None,
        key: str | None,
    ) -> Described:
        """Write rows (``batch`` encoded, ``blob`` its packed rows; None: tags only) for ``keys`` and merge
        ``tags``; a key naming no sample gets a new one. Returns the keys' samples and their descriptions.
        ``key``: an idempotency key (a re-sent put is stored once)."""
        ...

    async def get(self, partition: str, keys: list[str], fields: list[str] | None, mode: str, device: Any) -> KeysRead:
        """The keys' samples and the data of ``fields`` all of them have (None: every field they share).
        ``mode``: the Queue's zerocopy_mode; over a broker, data in shared memory comes as views unless "off"
        (and a broker that restarted meanwhile is asked again); embedded, rows read from the engine and copied
        (bytes moved count 0, as they always did)."""
        ...

    async def listing(self, partition: str | None) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tags}}`` of every key (of ``partition`` only, if given)."""
        ...

    async def clear(self, partition: str, keys: list[str]) -> int:
        """Clear the samples ``keys`` name (keys naming none are skipped); how many were cleared."""
        ...

    async def names(self, partition: str, indexes: list[int]) -> list[str | None]:
        """The key each sample carries (None: none, or it was cleared)."""
        ...


@runtime_checkable
class TopicAPI(Protocol):
    """A topic as the client drives it (see the module docstring for the modes and the common contract)."""

    name: str
    config: TopicConfig
    keys: KeysAPI  # keyed samples

    @property
    def kinds(self) -> dict[str, str]:
        """Field -> kind (wire/codec.py) as this process knows them. Embedded: the engine's own, always current
        (read only). Over a broker: what the last reply said; ``refresh_kinds`` asks again."""
        ...

    @property
    def exclusive(self) -> bool:
        """Whether only this process reads and writes the topic: embedded, its files are locked to this process;
        over a broker, other processes may use it at any time (the persist-queue layer defers writes only when
        True)."""
        ...

    @property
    def arena(self) -> ArenaClient | None:
        """The shared memory tensor batches go through (puts, reservations, views), or None where there is
        none: embedded mode (one process, nothing to share). Over a broker it is there even if the broker runs
        without an arena: ``await arena.has_arena()`` says."""
        ...

    def count(self) -> int:
        """Records stored and acknowledged, without waiting: embedded, exact; over a broker, as last seen."""
        ...

    def current_count(self) -> int:
        """Records stored and acknowledged now, blocking this thread: embedded, the engine's count at once; over
        a broker, one request (from the engine loop's own thread, which must not block: the count last seen)."""
        ...

    def new_put_key(self) -> str | None:
        """The idempotency key a put without one is sent with: over a broker a fresh one (the connection's
        re-sends and a caller's retry after ``BrokerUnavailableError`` are stored once); embedded None (nothing
        re-sends a put)."""
        ...

    def stored(self, first: int, count: int, kinds: dict[str, str]) -> tuple[int, int]:
        """Note a tensor batch ``arena`` sealed (``put_tensors``/``put_reserved``): ``kinds`` and ``count`` learn
        from it. Returns ``(first, count)``. Embedded there is no arena, so nothing calls it there."""
        ...

    async def aclose(self) -> None:
        """Let the topic go. Embedded: the last holder in this process flushes and closes the engine's topic;
        over a broker: the arena's leases and holds are given back (the broker keeps the topic)."""
        ...

    async def append(
        self,
        batch: EncodedBatch,
        partition: str,
        rows_blob: bytes,
        key: str | None = None,
        of: list[int] | None = None,
        dedup_bytes: tuple[int, int] | None = None,
        durable: bool = True,
    ) -> tuple[int, int]:
        """Store encoded rows; (first global index, count) once acknowledged (``durability``). ``key``: a put
        sent again with it is stored once (over a broker a fresh key is made if None). ``of``: the rows patch
        these samples. ``dedup_bytes``: (bytes put, stored) of deduped fields, for the broker's status (embedded:
        unused). ``durable=False``: embedded, acknowledged before its own fdatasync; a broker's puts are always
        durable (ignored there)."""
        ...

    async def read_window(self, offset: int, limit: int) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """Stored rows with global index in ``[offset, offset + limit)``, the kinds to decode them, and where the
        window ended (the next read starts there; a window of cleared samples holds fewer rows than it spans)."""
        ...

    async def read_waiting(
        self, offset: int, limit: int, timeout: float | None
    ) -> tuple[list[dict[str, Any]], dict[str, str], int]:
        """``read_window``, but at the end of the data first wait up to ``timeout`` seconds (None: for ever) for
        rows at ``offset``; empty, ending at ``offset``, if none came. Embedded: a read, then a wait for the next
        put, then a read, all on the engine loop; over a broker: a long poll, one round trip per page."""
        ...

    async def wait_beyond(self, index: int, timeout: float | None) -> bool:
        """Wait (notified, not polling) until a record with global index >= ``index`` is visible; False after
        ``timeout`` seconds (None: for ever) without one."""
        ...

    async def flush(self) -> None:
        """Return once every record acknowledged before the call is stored in the backends (Lance)."""
        ...

    async def stats(self) -> dict[str, Any]:
        """The topic's stats (``engine.Topic.stats``); over a broker with ``"broker"``: its address; embedded
        with a metrics backend (``enable_metrics``) with ``"metrics"``: the engine's counters."""
        ...

    async def refresh_kinds(self, fields: list[str] | None) -> None:
        """Bring ``kinds`` up to date if one of ``fields`` (None: in any case) is not among them: over a broker
        one stats request (another process may have put it); embedded nothing to do (always current)."""
        ...

    async def take(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        sampler: Any,
        sampler_kw: dict[str, int],
        lease: float | None,
        fields: list[str] | None,
    ) -> Described:
        """Hand up to ``batch_size`` samples of ``partition`` whose ``fields`` are all produced to ``task``
        (``engine.Topic.take``), waiting up to ``timeout`` seconds (None: for ever, 0: not) for a full batch;
        with their descriptions. ``lease``: seconds of acknowledged delivery (None: consume-on-fetch).
        ``sampler``: a ``persisting.samplers`` one or None, checked here (``ConfigError``); embedded any object
        with ``sample()``, over a broker the built-in ones only (the broker rebuilds them from their wire form)."""
        ...

    async def take_batch(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        fields: list[str],
        mode: str,
        device: Any,
        sampler: Any,
        sampler_kw: dict[str, int],
        lease: float | None,
    ) -> tuple[list[int], list[list[Any]], Batch, int, int]:
        """``take`` and ``get_data`` of ``fields`` together: (indexes, descriptions, data, bytes as views, bytes
        copied). Over a broker in one round trip (a batch larger than one reply then comes in pieces); embedded,
        both on the engine, a large batch read in pieces as ``get_data`` reads one. Deduped fields come as their
        references (the caller resolves them)."""
        ...

    async def take_rows(
        self,
        partition: str,
        task: str,
        batch_size: int,
        timeout: float | None,
        sampler: Any,
        lease: float | None,
        fields: list[str],
        note: dict[str, Any] | None = None,
    ) -> tuple[list[tuple[int, dict[str, Any]]], range | None]:
        """A take of every sample (no readiness), with the stored rows of ``fields`` (a later write of a field
        wins), without descriptions: the persist-queue layer's get of one record. ``note`` ({partition, field,
        values}): a broker with riders appends ``{field: global index, **values}`` per sample taken before it
        replies and returns their range second; None where nobody wrote them (embedded, no note, nothing taken,
        a broker without riders): the caller writes them then."""
        ...

    async def describe(self, indexes: list[int]) -> list[list[Any]]:
        """Descriptions of samples (``engine.Topic.describe``); a cleared sample raises ``ConfigError``."""
        ...

    async def get_data(
        self, indexes: list[int], fields: list[str], mode: str, device: Any, copy: bool = True, views_only: bool = False
    ) -> tuple[Batch, int, int]:
        """The samples' ``fields``: (data, bytes handed over as views, bytes copied). ``mode``: zerocopy_mode;
        embedded copies, and "force" raises ``ConfigError`` there. ``copy=False``: a piece of a larger read
        (``batches.from_columns``). ``views_only``: a batch too large for one reply of copies, wanted only if it
        lies in shared memory: an empty batch otherwise (always, embedded)."""
        ...

    async def mark_consumed(
        self, partition: str, task: str, indexes: list[int], then_put: tuple[str, EncodedBatch, bytes] | None = None
    ) -> range | None:
        """Acknowledge samples for ``task`` (logged; never handed to it again). ``then_put`` (partition, encoded
        records, their rows blob): a durable put of them once the consumption is logged, its range returned
        (through a broker with riders in the same round trip, else a second call); None without one."""
        ...

    async def give_back(self, partition: str, task: str, indexes: list[int]) -> None:
        """End ``task``'s leases on these samples unconsumed (a nack): ready for the task again."""
        ...

    async def reset_consumption(self, partition: str, task: str) -> None:
        """Every sample of ``partition`` becomes available to ``task`` again (logged: survives a restart)."""
        ...

    async def consumed(self, partition: str, task: str) -> set[int] | None:
        """The samples ``task`` consumed in ``partition`` (not those leased): embedded, from the engine's state;
        over a broker None (the broker keeps it; what a restart's repair compares is the broker's own)."""
        ...

    async def clear(self, partition: str, indexes: list[int] | None) -> int:
        """Delete samples of ``partition`` (None: all of them), durably; how many were newly cleared."""
        ...

    async def set_tags(self, partition: str, items: list[tuple[int, dict[str, Any]]]) -> None:
        """Merge tags (``custom_meta``) into samples, durably; ``items``: (global index, tags)."""
        ...

    async def partitions(self) -> dict[str, dict[str, Any]]:
        """Every partition with its sample, cleared and per-task counts (``Queue.partitions``)."""
        ...

    async def spool_begin(self) -> tuple[str, str]:
        """A new spool file for a batch put through disk (``big_batches.spool``): (its name, the path this
        process writes it at). Embedded: in the topic's folder; over a broker: the broker names and places it.
        ``ConfigError`` for a topic in an object store (no spool folder)."""
        ...

    async def put_spooled(
        self,
        plain: EncodedBatch,
        partition: str,
        blob: bytes,
        key: str,
        name: str,
        fields: list[Any],
        of: list[int] | None,
    ) -> tuple[int, int]:
        """Store a batch whose dense ``fields`` (``pieces.layout``) were written to spool file ``name`` and whose
        other fields are ``plain`` (``blob``: its rows); the engine takes the file over. (first, count)."""
        ...

    async def spool_where(self, indexes: list[int], dense: list[str]) -> Any:
        """Where the samples' ``dense`` fields lie in spool files still there (``pieces.from_spool`` reads it);
        None if not all of them do."""
        ...
