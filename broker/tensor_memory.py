"""The broker's shared memory for tensor batches: the arena, its segments and extents, and the re-adoption of what a
killed broker left there (the requests that move tensor batches: broker/requests/tensors.py, broker/requests/reads.py).

A producer leases an extent, writes its batch there itself (the only copy a tensor gets), and sends
``put_tensors`` with the layout; the broker checks the layout against the lease, logs a reference (not the
bytes) and makes the samples visible. A consumer's ``get_data`` gets offsets into the arena plus a hold that
keeps those extents from reuse until it releases them (or dies). The background flush writes the payload to
Lance; an extent is reused once its rows are flushed and nobody holds it.

The arena is segments within a budget (``persisting/tensors/arena.py``, ``segments.py``): segment 0 is made at
start, the others when leases need them; every size below the budget goes through them the same way.

Broker restarts: the segment files outlive a killed broker (they are in /dev/shm). At start-up, the files left
behind are attached read-only, every topic is opened (its log replay copies the payloads that frames point to
from those files, and flushes them to Lance), then the files are unlinked (one log line names each, with its
size) and a fresh arena is created. So an acknowledged tensor batch survives kill -9 of any process; only a
machine restart before its flush loses its payload (logged; the rows keep their indexes with those fields None).
``flush()`` makes it durable on disk. A topic that cannot be opened at that start (damaged, held by another
process) does not keep the files in /dev/shm nor stop the start: the ranges its log still needs are copied to disk
first (``kept.py``, which says why), and its next open through the broker replays from there; only when that copy
fails does the start fail, naming the files it leaves for the next one. Extent ids
start again at 1 in a restarted broker, so requests that name extents carry the arena generation they were
leased from: a put naming an older arena's extent gets ``UnknownExtentError`` (the client leases afresh), an
abandon of one is ignored; neither may touch an extent the same client leased from this broker.

A reservation (``Queue.reserve``) is a lease like any other, filled by the producer at its own pace and sealed by
the same ``put_tensors``: the reaper frees it if its producer dies first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from persisting.engine import ObjectStoreTopic, Topic, TopicConfig, stored_topics
from persisting.errors import PersistingError, StorageError
from persisting.storage.lance_backend import LanceBackend
from persisting.tensors import arena as arena_mod
from persisting.tensors.arena import Arena

from .extents import Extents
from .kept import KeptStore, named
from .retries import RetriedPuts
from .segments import SegmentBook, default_budget

log = logging.getLogger("persisting.broker")

REAP_INTERVAL_SECONDS = 1.0
# A topic flushes at once when this share of segment 0, or of the budget, waits to reach Lance (arena batches are
# written behind, see persisting/engine/flushing.py): the rest is the producers' room while that flush runs.
# Segment 0's share keeps small batches streaming through warm memory; big ones use segments of their own.
FLUSH_AT_ARENA_SHARE = float(os.environ.get("PERSISTING_FLUSH_AT_ARENA_SHARE", "0.75"))
MAX_LEASE_WAIT_SECONDS = 60.0
# The most of the budget one process may pin with leases it has not put and views it holds (extents.py).
MAX_PINNED_SHARE = float(os.environ.get("PERSISTING_MAX_PINNED_SHARE", "0.5"))


class TensorMemory:
    def __init__(
        self,
        storage_path: Path,
        size_bytes: int,
        mode: int = 0o600,
        topics: Callable[[], Iterable[Topic]] = tuple,
        budget_bytes: int | None = None,
        shm_dir: Path = arena_mod.SHM_DIR,
    ) -> None:
        self.storage_path = storage_path
        self._open_topics = topics
        self.remote_for: Callable[[str], ObjectStoreTopic | None] = lambda name: None  # set by the Broker
        self.size_bytes = size_bytes
        self.budget_bytes = (
            default_budget(size_bytes, shm_dir) if budget_bytes is None else max(budget_bytes, size_bytes)
        )
        self.mode = mode
        self.path = arena_mod.default_path(storage_path, shm_dir)
        self.arena: Arena | None = None
        self.extents: Extents | None = None
        self.book: SegmentBook | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._previous: Arena | None = None
        self.kept = KeptStore(storage_path)  # payloads a start could not re-adopt, on disk (kept.py)
        self.retried = RetriedPuts()  # retried tensor puts give back the extents they brought (retries.py)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, backend_options: dict[str, Any]) -> None:
        self.kept.load()
        if self.path.exists():
            await self._recover(backend_options)  # even when the new run has no arena
        elif self.kept.topics():
            await self._readopt(backend_options, sorted(self.kept.topics()))
        left = arena_mod.leftover_segments(self.path)
        if left:  # of a broker killed while it gave its arena back (after every topic re-adopted or kept)
            log.warning("removing the shared-memory segments a killed broker left: %s", named(left))
            for path in left:
                path.unlink(missing_ok=True)
        if not self.size_bytes:
            return
        self.arena = Arena.create(self.path, self.size_bytes, self.mode)
        self.book = SegmentBook(self.arena, self.budget_bytes)
        most = max(int(self.book.largest_batch_bytes() * MAX_PINNED_SHARE), arena_mod.EXTENT_ALIGN_BYTES)
        self.extents = Extents(self.arena.size_bytes, self._flush_sealed, self._evicted, most, self.book)
        self._reaper = asyncio.ensure_future(self._reap_loop())
        log.info("arena %s: %d bytes, budget %d bytes", self.path, self.arena.size_bytes, self.book.budget_bytes)

    async def _recover(self, backend_options: dict[str, Any]) -> None:
        """Re-adopt the payloads of the arena a killed broker left, then give its files back: every topic is opened
        (its replay copies them and flushes them); those of a topic that cannot be opened are kept on disk first
        (kept.py); if even that fails, the files stay for the next start, named in the log, and the start fails."""
        files = [self.path, *arena_mod.leftover_segments(self.path)]
        try:
            self._previous = Arena.attach(self.path, writable=False)
        except PersistingError as exc:
            log.error("removing an unusable arena file left at %s: %s", named([self.path]), exc)
            self.path.unlink(missing_ok=True)
            return
        log.warning("an arena file was left by a broker that did not stop cleanly; re-adopting its payloads")
        failed = await self._readopt(backend_options, [name for name, _config in self._stored(backend_options)])
        previous = self._previous
        kept = None
        if failed:
            try:
                kept = await asyncio.to_thread(self.kept.keep, previous, failed)
            except (OSError, PersistingError) as exc:
                log.error(
                    "could not keep on disk the payloads that topic(s) %s still need (%s): the shared-memory files "
                    "of the killed broker stay for the next start to re-adopt: %s",
                    ", ".join(failed),
                    exc,
                    named(files),
                )
                raise StorageError(
                    f"cannot keep the tensor payloads of topic(s) {', '.join(failed)} under {self.kept.root}: {exc}"
                ) from exc
        gone = named(files)
        if kept is not None:
            gone += f"; the {kept[1]} bytes that topic(s) {', '.join(failed)} still need are kept in {kept[0]}"
        self._previous = None
        previous.close()
        self.path.unlink(missing_ok=True)  # first: without it the others are swept, never re-adopted again
        for path in files[1:]:
            path.unlink(missing_ok=True)
        log.warning("gave back the shared memory of the broker that did not stop cleanly: %s", gone)

    def _stored(self, backend_options: dict[str, Any]) -> list[tuple[str, TopicConfig]]:
        return stored_topics(self.storage_path, backend_options)

    async def _readopt(self, backend_options: dict[str, Any], names: list[str]) -> list[str]:
        """Open and close each topic of ``names`` (its replay takes what it needs from the arena left behind or
        from kept payloads, and flushes it); returns those that could not be opened, each logged."""
        configs = dict(self._stored(backend_options))
        failed = []
        for name in names:
            config = configs.get(name)
            if config is None:  # a kept topic that was removed since: nothing needs its payloads
                self.kept.adopted(name)
                continue
            remote = self.remote_for(name)
            topic = Topic(name, self.storage_path, config, LanceBackend, arena_resolver=self.resolve, remote=remote)
            try:
                await topic.open()  # replays (copying arena payloads) and flushes what the log held
                await topic.close()
            except Exception as exc:
                await topic.close_quietly()
                log.error("topic %r could not be opened to re-adopt its tensor payloads: %s", name, exc)
                failed.append(name)
                continue
            self.kept.adopted(name)
        return failed

    def _flush_sealed(self) -> None:
        if self.extents is None:
            return
        waiting = {e.topic for e in self.extents.extents.values() if e.sealed and not e.persisted}
        for topic in self._open_topics():
            if topic.name in waiting:
                topic.flush_soon()

    def _evicted(self, topic_name: str, extent_id: int) -> None:
        for topic in self._open_topics():
            if topic.name == topic_name:
                topic.forget_arena(extent_id)

    def resolve(self, generation: bytes, offset: int, nbytes: int) -> np.ndarray | None:
        """Bytes a log frame points to, from the arena file of that generation if it is still there."""
        for candidate in (self._previous, self.arena):
            if candidate is not None and candidate.generation == generation:
                return candidate.view(offset, nbytes)
        return self.kept.resolve(generation, offset, nbytes)

    def on_flushed(self, topic: str, flushed_upto: int) -> None:
        if self.extents is not None:
            self.extents.persisted(topic, flushed_upto)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_SECONDS)
            if self.extents is not None:
                gone = self.extents.reap()
                if gone:
                    log.info("released %d lease(s)/hold(s) of processes that exited", gone)
                self.extents.give_back_idle()

    async def close(self) -> None:
        """After every topic is closed (flushed): drop the arena file."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(BaseException):
                await self._reaper
            self._reaper = None
        if self.book is not None:
            self.book.close()
            self.book = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def largest_batch_bytes(self) -> int:
        """The most tensor bytes one batch may have to go through shared memory (0: no arena)."""
        return 0 if self.extents is None else self.extents.largest_bytes

    def hello(self) -> dict[str, Any]:
        if self.arena is None or self.extents is None:
            return {}
        return {
            "path": str(self.path),
            "size_bytes": self.arena.size_bytes,
            "generation": self.arena.generation,
            "largest_batch_bytes": self.extents.largest_bytes,
        }

    def stats(self) -> dict[str, Any]:
        return {} if self.extents is None else {"path": str(self.path), **self.extents.stats()}

    def flush_at(self, offset: int) -> float:
        """Unflushed bytes past which a put starts a flush: a share of segment 0 for a batch there, else of the
        budget (a big batch's own segment: memory pressure, not its size, sends it to disk)."""
        if offset >> arena_mod.SEGMENT_SHIFT == 0:
            return self.size_bytes * FLUSH_AT_ARENA_SHARE
        return self.budget_bytes * FLUSH_AT_ARENA_SHARE
