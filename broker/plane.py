"""The tensor plane of the broker: the arena, its extents, and the requests that move tensor batches.

A producer leases an extent, writes its batch there itself (the only copy a tensor gets), and sends
``put_tensors`` with the layout; the broker checks the layout against the lease, logs a reference (not the
bytes) and makes the samples visible. A consumer's ``get_data`` gets offsets into the arena plus a hold that
keeps those extents from reuse until it releases them (or dies). The background flush writes the payload to
Lance; an extent is reused once its rows are flushed and nobody holds it.

The arena is segments within a budget (``persisting/tensors/arena.py``, ``segments.py``): segment 0 is made at
start, the others when leases need them; every size below the budget goes through them the same way.

Broker restarts: the segment files outlive a killed broker (they are in /dev/shm). At start-up, the files left
behind are attached read-only, every topic is opened (its log replay copies the payloads that frames point to
from those files, and flushes them to Lance), then the files are unlinked and a fresh arena is created. So an
acknowledged tensor batch survives kill -9 of any process; only a machine restart before its flush loses its payload
(logged; the rows keep their indexes with those fields None). ``flush()`` makes it durable on disk. Extent ids
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
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from persisting.engine import ArenaPayload, ObjectStoreTopic, Topic, stored_topics
from persisting.errors import ConfigError, InvalidRecordError, PersistingError, ProtocolError, UnknownExtentError
from persisting.storage.lance_backend import LanceBackend
from persisting.tensors import arena as arena_mod
from persisting.tensors import column as tensors
from persisting.tensors import jagged
from persisting.tensors.arena import FIELD_ALIGN_BYTES, Arena
from persisting.wire import codec, columns, row_checks
from persisting.wire.protocol import Reply, Request, arg

from . import givebacks, keys, peers, riders, spooling, takes
from .extents import Extents, Peer
from .givebacks import int_list
from .retries import RetriedPuts
from .segments import SegmentBook, default_budget

log = logging.getLogger("persisting.broker")

SAMPLE_OPS = frozenset(
    {"take", "describe", "get_data", "mark_consumed", "reset_consumption", "clear", "partitions", "set_tags"}
    | {"give_back"}
)
OPS = frozenset({"lease", "put_tensors", "release"}) | SAMPLE_OPS | spooling.OPS
REAP_INTERVAL_SECONDS = 1.0
# A topic flushes at once when this share of segment 0, or of the budget, waits to reach Lance (arena batches are
# written behind, see persisting/engine/flushing.py): the rest is the producers' room while that flush runs.
# Segment 0's share keeps small batches streaming through warm memory; big ones use segments of their own.
FLUSH_AT_ARENA_SHARE = float(os.environ.get("PERSISTING_FLUSH_AT_ARENA_SHARE", "0.75"))
MAX_LEASE_WAIT_SECONDS = 60.0
# The most of the budget one process may pin with leases it has not put and views it holds (extents.py).
MAX_PINNED_SHARE = float(os.environ.get("PERSISTING_MAX_PINNED_SHARE", "0.5"))


class TensorPlane:
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
        self._retried = RetriedPuts()  # retried tensor puts give back the extents they brought (retries.py)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, backend_options: dict[str, Any]) -> None:
        if self.path.exists():
            await self._recover(backend_options)  # even when the new run has no arena
        for left in arena_mod.leftover_segments(self.path):  # of a broker killed after its log let them go
            left.unlink(missing_ok=True)
        if not self.size_bytes:
            return
        self.arena = Arena.create(self.path, self.size_bytes, self.mode)
        self.book = SegmentBook(self.arena, self.budget_bytes)
        most = max(int(self.book.largest_batch_bytes() * MAX_PINNED_SHARE), arena_mod.EXTENT_ALIGN_BYTES)
        self.extents = Extents(self.arena.size_bytes, self._flush_sealed, self._evicted, most, self.book)
        self._reaper = asyncio.ensure_future(self._reap_loop())
        log.info("arena %s: %d bytes, budget %d bytes", self.path, self.arena.size_bytes, self.book.budget_bytes)

    async def _recover(self, backend_options: dict[str, Any]) -> None:
        try:
            self._previous = Arena.attach(self.path, writable=False)
        except PersistingError as exc:
            log.error("removing an unusable arena file left at %s: %s", self.path, exc)
            self.path.unlink(missing_ok=True)
            return
        log.warning("an arena file was left by a broker that did not stop cleanly; re-adopting its payloads")
        for name, config in stored_topics(self.storage_path, backend_options):
            remote = self.remote_for(name)
            topic = Topic(name, self.storage_path, config, LanceBackend, arena_resolver=self.resolve, remote=remote)
            try:
                await topic.open()  # replays (copying arena payloads) and flushes what the log held
                await topic.close()
            except Exception:
                await topic.close_quietly()
                raise
        previous, self._previous = self._previous, None
        previous.close()
        self.path.unlink(missing_ok=True)  # (its other segments: start() sweeps them next)

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
        return None

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

    # -- requests -----------------------------------------------------------------------------------

    async def handle(self, req: Request, topic: Topic | None, peer: Peer | None = None) -> Reply:
        """``peer``: the sender as the kernel names it (``peers.py``); None where the transport does not say."""
        arena, extents = self.arena, self.extents
        if topic is not None and req.op in SAMPLE_OPS:
            if req.op == "take":
                return await takes.take(self, req, topic, peer)
            return await self._samples(req, topic, peer)
        if req.op in spooling.OPS:  # larger than the arena: not through it
            return await spooling.handle(req, topic, peer)
        if arena is None or extents is None:
            raise ConfigError("this broker runs without an arena (--arena-bytes 0): tensor batches go over the socket")
        givebacks.apply(req, extents, arena, peer)
        if req.op == "lease":
            nbytes = arg(req, "nbytes", int)
            timeout = req.args.get("timeout")
            if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
                raise ProtocolError("lease timeout must be a number >= 0")
            owner = peers.arena_peer(req, peer)
            ext = await extents.lease(nbytes, owner, min(float(timeout), MAX_LEASE_WAIT_SECONDS))
            return Reply(req.id, True, [ext.id, ext.offset, ext.nbytes, arena.generation])
        if req.op == "release":
            hold = req.args.get("hold")
            return Reply(req.id, True, type(hold) is int and peer is not None and extents.release(hold, peer))
        if topic is None:
            raise ProtocolError(f"{req.op} needs a topic")
        if req.op == "put_tensors":
            return Reply(req.id, True, await self._put(req, topic, arena, extents, peers.arena_peer(req, peer)))
        raise ProtocolError(f"unknown operation {req.op!r}")

    async def _samples(self, req: Request, topic: Topic, peer: Peer | None) -> Reply:
        """Requests about samples: they work without an arena too (data then comes as copies)."""
        if self.extents is not None:
            givebacks.apply(req, self.extents, self.arena, peer)
        if req.op == "mark_consumed":
            indexes = int_list(req.args.get("indexes"), "indexes")
            put = riders.then_put_of(req)
            await topic.mark_consumed(arg(req, "partition", str), arg(req, "task", str), indexes)
            return Reply(req.id, True, None if put is None else await riders.write_then_put(req, topic, put))
        if req.op == "give_back":
            indexes = int_list(req.args.get("indexes"), "indexes")
            topic.give_back(arg(req, "partition", str), arg(req, "task", str), indexes)
            return Reply(req.id, True, None)
        if req.op == "reset_consumption":
            topic.reset_consumption(arg(req, "partition", str), arg(req, "task", str))
            return Reply(req.id, True, None)
        if req.op == "clear":
            raw = req.args.get("indexes")
            chosen = None if raw is None else int_list(raw, "indexes")
            return Reply(req.id, True, await topic.clear(arg(req, "partition", str), chosen))
        if req.op == "partitions":
            return Reply(req.id, True, await topic.partitions())
        if req.op == "set_tags":
            items = req.args.get("items")
            if not isinstance(items, list) or not all(
                isinstance(it, list) and len(it) == 2 and type(it[0]) is int and isinstance(it[1], dict) for it in items
            ):
                raise ProtocolError("set_tags items must be a list of [global index, {key: value}]")
            await topic.set_tags(arg(req, "partition", str), [(it[0], it[1]) for it in items])
            return Reply(req.id, True, None)
        if req.op == "describe":
            return Reply(req.id, True, await topic.describe(int_list(req.args.get("indexes"), "indexes")))
        if req.op == "get_data":
            return await self.get(req, topic, peer)
        raise ProtocolError(f"unknown operation {req.op!r}")

    def drop_hold(self, data: Reply, holder: Peer | None) -> None:
        """Give back the hold of a data reply that will not be sent (its views are never made)."""
        hold = data.result.get("hold") if isinstance(data.result, dict) else None
        if type(hold) is int and self.extents is not None and holder is not None:
            self.extents.release(hold, holder)

    async def _put(self, req: Request, topic: Topic, arena: Arena, extents: Extents, peer: Peer) -> list[Any]:
        key = req.args.get("key")
        if isinstance(key, str):
            # A re-sent put (its first attempt sealed the extent, maybe still waiting for its sync): same answer.
            done = await topic.recall(key)
            if done is not None:
                self._retried.recalled(key, req.args.get("extent"), givebacks.same_arena(req, arena), extents, peer)
                if req.args.get("kv") is None:
                    return list(done)
                return [
                    *done,
                    *[None] * (3 - len(done)),
                    *await keys.recalled(topic, req.args["kv"], arg(req, "partition", str)),
                ]
        if not givebacks.same_arena(req, arena):
            raise UnknownExtentError(f"extent {req.args.get('extent')!r} was leased from an arena before a restart")
        ext = extents.leased(arg(req, "extent", int), peer)
        try:
            count, partition = arg(req, "count", int), arg(req, "partition", str)
            kinds, fields = arg(req, "kinds", dict), arg(req, "fields", list)
            if len(req.buffers) != 1 or (key is not None and not isinstance(key, str)) or count < 0:
                raise ProtocolError("put_tensors needs one rows buffer, a str key (or none) and a count >= 0")
            try:
                other = msgpack.unpackb(req.buffers[0], raw=False, use_list=True)
            except Exception as exc:
                raise ProtocolError(f"put_tensors rows are not valid msgpack: {exc}") from exc
            rows = row_checks.check_rows(other, kinds, count)
            columns: dict[str, tensors.AnyColumn] = {}
            ref_fields = []
            for entry in fields:
                ragged = isinstance(entry, list) and len(entry) == 8 and entry[1] == jagged.KIND
                if not (isinstance(entry, list) and (len(entry) == 6 or ragged)):
                    raise ProtocolError("each put_tensors field is [name, kind, dtype, shape, offset, nbytes, ...]")
                name = entry[0]
                bad = not isinstance(name, str) or not name or name.startswith(codec.RESERVED_PREFIX)
                if bad or name in kinds or name in columns:
                    raise InvalidRecordError(f"invalid or repeated tensor field name {name!r}")
                if ragged:  # values + offsets (tensors/jagged.py)
                    columns[name] = jagged.from_arena(entry, count, arena.view, ext.nbytes, ext.offset)
                    ref_fields.append(list(entry))
                    continue
                name, kind, dtype_name, shape, offset, nbytes = entry
                dtype = tensors.storage_dtype(kind, dtype_name)
                shape = int_list(shape, f"shape of field {name!r}")
                want = count * math.prod(shape) * dtype.itemsize  # Python ints: no int64 wrap-around
                if type(offset) is not int or offset % FIELD_ALIGN_BYTES or nbytes != want:
                    raise ProtocolError(f"field {name!r}: {nbytes!r} bytes at {offset!r} do not fit {count}x{shape}")
                if offset < 0 or offset + nbytes > ext.nbytes:
                    raise ProtocolError(f"field {name!r} lies outside its extent ({ext.nbytes} bytes)")
                view = arena.view(ext.offset + offset, nbytes).view(dtype).reshape((count, *shape))
                columns[name] = tensors.Column(kind, dtype_name, view)
                ref_fields.append([name, kind, dtype_name, shape, offset, nbytes])
            all_kinds = {**kinds, **{name: col.kind for name, col in columns.items()}}
            ref = {"gen": arena.generation, "offset": ext.offset, "fields": ref_fields}
            payload = ArenaPayload(ext.id, ref, columns)
            # Sealed before the await: the reaper must not free it if the producer dies while we log it.
            extents.seal(ext, topic.name, 2**62)
            of = None if req.args.get("of") is None else int_list(req.args["of"], "of")
            batch = codec.EncodedBatch(rows, all_kinds)
            kv = req.args.get("kv")
            if kv is not None:  # a keyed put (Queue.kv_put): the engine's key index decides new samples or a patch
                first, n, keyed = await keys.put(topic, kv, batch, partition, req.buffers[0], key, payload)
            else:
                (first, n), keyed = await topic.append(batch, partition, req.buffers[0], key, arena=payload, of=of), []
        except BaseException:
            extents.abandon(ext)
            raise
        if not payload.used:
            # A retried put (its key was stored by the first attempt) or an empty batch: no row points here.
            extents.abandon(ext)
        else:
            extents.seal(ext, topic.name, first + n - 1)
            if first + n <= topic.flushed_upto:  # flushed while it was logged (on_flushed saw it unsealed)
                extents.persisted(topic.name, topic.flushed_upto)
            if extents.unpersisted_bytes() > self._flush_at(ext.offset):
                topic.flush_soon()  # before producers have to wait for space
        nxt = req.args.get("lease_next")
        out: list[Any] = [first, n]
        if type(nxt) is int and nxt > 0:
            # The producer's next extent, if one is free now (never waits): its next put skips the lease request.
            spare = extents.try_lease(nxt, peer)
            if spare is not None:
                self._retried.leased_ahead(key, spare.id)
                out.append([spare.id, spare.offset, spare.nbytes, arena.generation])
        if kv is not None:
            out += [None] * (3 - len(out)) + keyed
        return out

    def _flush_at(self, offset: int) -> float:
        """Unflushed bytes past which a put starts a flush: a share of segment 0 for a batch there, else of the
        budget (a big batch's own segment: memory pressure, not its size, sends it to disk)."""
        if offset >> arena_mod.SEGMENT_SHIFT == 0:
            return self.size_bytes * FLUSH_AT_ARENA_SHARE
        return self.budget_bytes * FLUSH_AT_ARENA_SHARE

    async def get(
        self, req: Request, topic: Topic, peer: Peer | None, taken: list[int] | None = None, views_only: bool = False
    ) -> Reply:
        """A ``get_data`` reply; also a take's with ``fields`` (takes.py) and keys.py's kv_get (``taken``: the
        samples just taken, or the keys' samples). ``views_only`` (or the request's ``views_only``): views of
        shared memory or ``{"later": True}``, never copies (a batch too large for one reply)."""
        arena, extents = self.arena, self.extents
        indexes = int_list(req.args.get("indexes"), "indexes") if taken is None else taken
        fields = req.args.get("fields")
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise ProtocolError("get_data fields must be a list of str")
        if taken is None and (kept := topic.not_cleared(indexes)) != indexes:  # as embedded get_data says it
            gone = sorted(set(indexes) - set(kept))[:10]
            raise ConfigError(f"samples with global indexes {gone} were cleared (clear()); they have no data")
        await topic.field_index()  # before arena_runs, which follows fields written by patches
        zerocopy = req.args.get("zerocopy", True) and peer is not None  # views only for a process the kernel names
        if arena is not None and extents is not None and peer is not None and zerocopy and indexes:
            tensor_fields = [f for f in fields if topic.kinds.get(f) in ("ndarray", "tensor", "jagged")]
            runs = topic.arena_runs(indexes, tensor_fields)
            if runs is not None and not tensor_fields:
                runs = None  # nothing to map: no hold (the plain fields come as rows below)
            if runs is not None and not extents.may_hold(peer, [eid for eid, _ in runs]):
                runs = None  # this process pins its share of the arena already: copies (extents.py, the cap)
            if runs is not None:
                for _eid, entries in runs:
                    for entry in entries:
                        entry[4] = arena.offset_of(entry[4])
                # The non-tensor fields of arena batches sit beside the views in the tail: no payload copy.
                plain = [f for f in fields if f not in tensor_fields]
                hold = extents.hold([eid for eid, _ in runs], peer)
                # (the hold keeps the views valid meanwhile); a tensors-only take sends no per-sample rows at all
                others = await topic.plain_values(indexes, plain) if plain else []
                result = {
                    "hold": hold,
                    "generation": arena.generation,
                    "runs": [entries for _, entries in runs],
                    "kinds": {f: topic.kinds[f] for f in plain if f in topic.kinds},
                }
                return Reply(req.id, True, result, buffers=[codec.pack(others)])
        if views_only or req.args.get(
            "views_only"
        ):  # a batch too large for one reply of copies: the client reads it otherwise
            return Reply(req.id, True, {"later": True})
        if req.args.get("columns"):  # the dense fields as raw frames, one per field (wire/columns.py)
            dense, rows, kinds = await topic.sample_columns(indexes, fields)
            entries, frames = columns.frames(dense)
            return Reply(req.id, True, {"kinds": kinds, "columns": entries}, buffers=[codec.pack(rows), *frames])
        rows, kinds = await topic.sample_rows(indexes, fields)
        return Reply(req.id, True, {"kinds": kinds}, buffers=[codec.pack(rows)])
