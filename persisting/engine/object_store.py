"""A topic on object storage: who may write it, and what a fresh node needs to read it.

Lance's rule on object stores: a dataset has one writer at a time (its commits are atomic through the store's
conditional put, but two engines appending to one bucket would interleave global indexes). Persisting enforces it
per topic with a lease, kept in the topic's ``owner.lance`` dataset beside its buckets::

    <uri>/<topic>/owner.lance    config: persisting.owner (node, host, pid, epoch, expiry), persisting.topic
                                 (num_buckets, bucket_column, backend), persisting.schema (field -> kind)
    <uri>/<topic>/bucket-<i>.lance

Every change of that config is a Lance commit made against the version its writer last saw, with no retry, so
it is a compare-and-swap: of two engines taking the topic at once, one commit lands and the other gets Lance's
commit conflict (``TopicLockedError`` here). The holder renews the lease every third of ``LEASE_SECONDS``
(``PERSISTING_OWNER_LEASE_S``, 30 s); a renewal that conflicts means another engine took the topic over (after
the lease ran out), and from then on every write of this engine's buckets raises ``StorageError`` (``guard``),
as do writes once its own lease may have run out unrenewed. Another node may take the topic once the lease has
run out; the same node (same ``local_path``) at once if the holder's process is gone. Wall clocks of the nodes
must agree to well within the lease (NTP).

What stays local (``local_path``): the write-ahead log, the consumption log, the topic's flock. The local copy is
trusted only if this node held the latest lease (``owner.json`` records the epoch it was written under);
otherwise it is moved aside (``stale-<epoch>-<time>/``, logged) and the topic starts from the object store:
settings and schema from ``owner.lance``, ``flushed_upto`` from the largest global index the buckets hold.
So a fresh node serves every flushed record; it does not have what only the lost disk held (acknowledged
records not yet flushed, consumption state: samples taken are handed out again, tags and clears of samples
whose rows were not yet purged).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConfigError, StorageError, TopicLockedError
from ..tensors.arena import peer_alive, peer_id
from ..wire.codec import INDEX_KEY
from .layout import read_json, write_json_atomic

if TYPE_CHECKING:
    from .location import Location  # location makes a TopicStore (lazily): a type here, not an import

log = logging.getLogger(__name__)

LEASE_SECONDS = float(os.environ.get("PERSISTING_OWNER_LEASE_S", "30"))
# The holder stops writing this long before the expiry others see: room for clock skew and a slow request.
LEASE_MARGIN_FRACTION = 0.2
OWNER_DATASET = "owner.lance"
OWNER_KEY = "persisting.owner"
SETTINGS_KEY = "persisting.topic"
KINDS_KEY = "persisting.schema"
LOCAL_OWNER_FILE = "owner.json"
LOCAL_STATE = ("wal", "consumption.log", "state.json", "schema.json", "topic.json")
_NOT_FOUND = "was not found"


def node_id(local_root: Path) -> str:
    """This node's identity for a local root: made once, kept in ``<local_root>/node-id``."""
    path = local_root / "node-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        local_root.mkdir(parents=True, exist_ok=True)
        made = uuid.uuid4().hex
        tmp = path.with_name(f"node-id.{os.getpid()}.tmp")
        tmp.write_text(made)
        try:
            os.link(tmp, path)  # first writer wins, a concurrent one reads the winner's id
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return path.read_text().strip()


class OwnerLease:
    """The topic's lease in ``owner.lance``: acquire, renew (a thread), publish config keys, release."""

    def __init__(self, uri: str, options: Mapping[str, str], node: str, topic: str) -> None:
        self.uri = uri
        self.options = dict(options)
        self.node = node
        self.topic = topic
        self.epoch = 0
        self.config: dict[str, str] = {}
        self._version = 0
        self._valid_until = 0.0  # time.monotonic(): writes are allowed before it
        self._lost: str | None = None
        self._lock = threading.Lock()  # one commit at a time (renewal thread, publish)
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # -- taking and keeping it ----------------------------------------------------------------------

    def acquire(
        self, settings: Mapping[str, Any], before_commit: Callable[[dict[str, Any] | None, int], None]
    ) -> dict[str, Any] | None:
        """Take the lease (``TopicLockedError`` if another live writer holds it); returns the previous holder.
        ``before_commit(previous holder, new epoch)`` runs just before the commit that takes it."""
        ds = self._open_or_create()
        config = dict(ds.config())
        holder = json.loads(config[OWNER_KEY]) if OWNER_KEY in config else None
        if holder is not None and self._held_by_other(holder):
            left = holder["expires"] - time.time()
            raise TopicLockedError(
                f"topic {self.topic!r} at {self.uri.rsplit('/', 1)[0]} has another writer: host "
                f"{holder.get('host')!r}, pid {holder.get('pid')}, lease epoch {holder.get('epoch')} valid "
                f"{left:.0f} s more. A Lance dataset takes one writer at a time: use that writer's broker, stop it, "
                f"or start this one after its lease ends (PERSISTING_OWNER_LEASE_S={LEASE_SECONDS:g})"
            )
        self.epoch = int(holder["epoch"]) + 1 if holder else 1
        updates = {} if SETTINGS_KEY in config else {SETTINGS_KEY: json.dumps(dict(settings))}
        self.config = config
        before_commit(holder, self.epoch)
        self._commit(ds.version, updates, acquiring=True)
        return holder

    def _held_by_other(self, holder: Mapping[str, Any]) -> bool:
        if holder.get("expires", 0) <= time.time():
            return False  # ran out or released
        if holder.get("node") != self.node:
            return True
        peer: list[int] = list(holder.get("peer") or [])  # same node: a holder whose process is gone holds nothing
        return not peer or (peer != peer_id() and peer_alive((int(peer[0]), int(peer[1]))))

    def start_renewing(self) -> None:
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease {self.topic}", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            try:
                self._commit(None, {})
            except TopicLockedError as exc:
                self._lost = str(exc)
                log.error("%s", exc)
                return
            except Exception as exc:  # the store unreachable: keep trying while the lease lasts
                log.warning("renewing the lease of topic %r failed (%s); retrying", self.topic, exc)

    def publish(self, updates: Mapping[str, str]) -> None:
        """Set config keys of ``owner.lance``, only while holding the lease (the commit is fenced by it)."""
        self._commit(None, dict(updates))

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._lost is None and self._version:
            try:
                self._commit(None, {}, expires=0.0)
            except Exception as exc:  # it runs out by itself
                log.warning("releasing the lease of topic %r failed: %s", self.topic, exc)
        self._valid_until = 0.0

    def guard(self) -> None:
        """Raise instead of writing a bucket without the lease (lost to another writer, or run out unrenewed)."""
        if self._lost is not None:
            raise StorageError(f"no longer the writer of topic {self.topic!r}: {self._lost}")
        if time.monotonic() >= self._valid_until:
            raise StorageError(
                f"the lease on topic {self.topic!r} ran out before it could be renewed (object store unreachable?); "
                "writes stop until it is renewed, so that no second writer can interleave"
            )

    # -- Lance ----------------------------------------------------------------------------------------

    def _open_or_create(self) -> lance.LanceDataset:
        try:
            return lance.dataset(self.uri, storage_options=self.options)
        except (ValueError, OSError) as exc:
            if _NOT_FOUND not in str(exc):
                raise StorageError(f"cannot open {self.uri}: {exc}") from exc
        # Created by one commit without retries: of engines creating it at once one lands, and a late one is
        # refused instead of overwriting (write_dataset's create would retry as an overwrite, config and all).
        op = lance.LanceOperation.Overwrite(pa.schema([pa.field("topic", pa.string())]), [])
        try:
            return lance.LanceDataset.commit(self.uri, op, max_retries=0, storage_options=self.options)
        except (ValueError, OSError) as exc:
            try:
                return lance.dataset(self.uri, storage_options=self.options)  # made meanwhile by another engine
            except (ValueError, OSError):
                raise StorageError(f"cannot create {self.uri}: {exc}") from exc

    def _commit(
        self,
        read_version: int | None,
        updates: dict[str, str],
        *,
        acquiring: bool = False,
        expires: float | None = None,
    ) -> None:
        """One compare-and-swap on owner.lance: against ``read_version``, or (None) the version of our last commit."""
        with self._lock:
            if read_version is None:
                read_version = self._version  # read under the lock: the renewal thread commits too
            started = time.monotonic()
            owner = {
                "node": self.node,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "peer": peer_id(),
                "epoch": self.epoch,
                "expires": time.time() + LEASE_SECONDS if expires is None else expires,
            }
            values: dict[str, str | None] = {**updates, OWNER_KEY: json.dumps(owner)}
            op = lance.LanceOperation.UpdateConfig(config_updates=lance.LanceOperation.UpdateMap(values, replace=False))
            try:
                ds = lance.LanceDataset.commit(
                    self.uri, op, read_version=read_version, max_retries=0, storage_options=self.options
                )
            except lance.commit.CommitConflictError as exc:
                what = "took the topic at the same moment" if acquiring else "took the topic over"
                raise TopicLockedError(
                    f"topic {self.topic!r}: another writer {what} ({self.uri} changed since version "
                    f"{read_version}); one writer at a time"
                ) from exc
            except (OSError, ValueError) as exc:
                raise StorageError(f"updating {self.uri} failed: {exc}") from exc
            self._version = ds.version
            self.config.update({**updates, OWNER_KEY: json.dumps(owner)})
            if expires is None:
                self._valid_until = started + LEASE_SECONDS * (1 - LEASE_MARGIN_FRACTION)


class TopicStore:
    """The object-store side of one topic, given to the engine's Topic (``remote=``): ``attach`` when it opens
    (after its local flock), ``publish_kinds`` before a flush writes rows of new fields, ``detach`` at close."""

    def __init__(self, location: Location, name: str, dirname: str) -> None:
        if location.uri is None:
            raise ConfigError("a TopicStore needs an object-store location")
        self.location = location
        self.name = name
        self.uri = location.topic_uri(dirname)
        self.lease = OwnerLease(f"{self.uri}/{OWNER_DATASET}", location.options, node_id(location.local), name)
        self.kinds: dict[str, str] = {}

    def backend(self, factory: Callable[..., Any]) -> Callable[..., Any]:
        """The engine's backend factory, pointed at the object store (the engine passes its local folder)."""
        uri, options, guard = self.uri, dict(self.location.options), self.lease.guard

        def make(bucket_id: int, _local: str, batch_size: int = 100, **kwargs: Any) -> Any:
            return factory(bucket_id, uri, batch_size, storage_options=options, guard=guard, **kwargs)

        return make

    def attach(self, path: Path, settings: Mapping[str, Any]) -> None:
        """Take the lease; keep the local state if this node wrote it under the latest lease, else start it
        from the object store (see the module docstring). Blocking: run it in a thread."""
        local_owner = read_json(path / LOCAL_OWNER_FILE) or {}

        def ours(holder: Mapping[str, Any] | None) -> bool:
            """Whether the local state was written under ``holder``'s lease (``next``: a take-over of our own
            lease that a crash may have cut between its commit and this file)."""
            return (
                holder is not None
                and holder.get("node") == self.lease.node
                and holder.get("epoch") in (local_owner.get("epoch"), local_owner.get("next"))
            )

        def before_commit(holder: Mapping[str, Any] | None, epoch: int) -> None:
            if ours(holder):
                write_json_atomic(path / LOCAL_OWNER_FILE, {**local_owner, "next": epoch, "uri": self.uri})

        previous = self.lease.acquire(settings, before_commit)
        if not ours(previous):
            self._set_aside(path, local_owner)
            self._restore(path, settings)
        write_json_atomic(path / LOCAL_OWNER_FILE, {"epoch": self.lease.epoch, "uri": self.uri})
        self.kinds = json.loads(self.lease.config.get(KINDS_KEY, "{}"))
        self.lease.start_renewing()

    def publish_kinds(self, kinds: Mapping[str, str]) -> None:
        """Before rows of these kinds reach the buckets: a fresh node decodes them with this schema."""
        if dict(kinds) != self.kinds:
            self.lease.publish({KINDS_KEY: json.dumps(dict(kinds))})
            self.kinds = dict(kinds)

    def detach(self) -> None:
        self.lease.release()

    def _set_aside(self, path: Path, local_owner: Mapping[str, Any]) -> None:
        present = [name for name in LOCAL_STATE if (path / name).exists()]
        if not present:
            return
        aside = path / f"stale-{local_owner.get('epoch', 0)}-{int(time.time())}"
        aside.mkdir()
        for name in present:
            os.replace(path / name, aside / name)
        log.error(
            "topic %r: the local state in %s was written under an older lease than the object store's (another "
            "node wrote the topic since); moved to %s and starting from %s. Records it held unflushed are not in "
            "the topic; consumption state starts empty",
            self.name,
            path,
            aside,
            self.uri,
        )

    def _restore(self, path: Path, settings: Mapping[str, Any]) -> None:
        config = self.lease.config
        write_json_atomic(path / "topic.json", json.loads(config[SETTINGS_KEY]) if SETTINGS_KEY in config else settings)
        if KINDS_KEY in config:
            write_json_atomic(path / "schema.json", json.loads(config[KINDS_KEY]))
        top = -1
        for b in range(int(settings.get("num_buckets", 0))):
            top = max(top, self._largest_index(f"{self.uri}/bucket-{b}.lance"))
        write_json_atomic(path / "state.json", {"flushed_upto": top + 1})
        if top >= 0:
            log.info("topic %r: %d records flushed to %s before this node took it", self.name, top + 1, self.uri)

    def _largest_index(self, uri: str) -> int:
        try:
            ds = lance.dataset(uri, storage_options=dict(self.location.options))
        except (ValueError, OSError) as exc:
            if _NOT_FOUND in str(exc):
                return -1
            raise StorageError(f"cannot open {uri}: {exc}") from exc
        try:
            column = ds.to_table(columns=[INDEX_KEY]).column(0)
        except (ValueError, OSError, pa.ArrowException) as exc:
            raise StorageError(f"reading {uri} failed: {exc}") from exc
        largest = pc.max(column).as_py() if len(column) else None
        return -1 if largest is None else int(largest)
