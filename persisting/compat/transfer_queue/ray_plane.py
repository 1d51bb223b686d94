"""The layer on several nodes: every KV call runs on the node that owns its partition (``persisting.ray``).

Which plane ``init(conf)`` uses (``persisting.backend``; chosen by ``interface.connect``):

- ``auto`` (the default): this one when Ray is up with more than one alive node, or when the run's first ``init``
  chose it (its directory actor exists); else one broker per node (``node_broker.py``: a single node stays on the
  direct broker path, with no Ray call).
- ``ray``: this one (Ray must be up); ``broker``: ``node_broker.py`` even on several nodes (then each node has its own
  keys: run the layer on one node only).

How it works. The first ``init`` starts ``persisting.ray`` (one broker per node, the registry of partition
owners) unless it runs already, and the run's directory (``ray_hosts.Directory``, with the conf section). A
partition (verl's ``train``, a step) is owned by the node whose process first writes to it (``kv_batch_put``,
``kv_put``, a ``put``, ``kv_retrieve_meta(create=True)``): the registry's first claim wins. Its data and its keys
live in that node's broker, so its key index is complete there. A KV call on a partition:

- owned by this node, or by nobody yet (a read then finds nothing, as on one node): runs here on the store over
  this node's broker (ipc, arena views: the same path and cost as on one node);
- owned by another node: runs there, in that node's KV host (``ray_hosts.KVHost``), in one Ray call; the fields
  put and the TensorDict read cross nodes through Ray's object store.

Failures: a host that dies (kill -9) is restarted by Ray on its node and the call is made again (every KV call
may be made twice: a put writes the same fields and tags again, a clear of a cleared key does nothing). A node
that is gone has its broker adopted by a live node (``persisting.ray``'s ``relocate``; on a shared folder with
everything it acknowledged). A killed broker is restarted by its node's actor on the same log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from typing import Any

from ... import ray as pray
from .. import _engine
from .config import DEFAULT_ARENA_BYTES, dedup_mode, open_store, storage_path
from .metadata import BatchMeta
from .ray_hosts import DIRECTORY_NAME, NAMESPACE, Directory, host_name, node_broker_address, pack, unpack
from .store import KVStore

BACKENDS = ("auto", "ray", "broker")
CALL_ATTEMPTS = 4  # a host restarted by Ray, or a broker moved to a live node, before the call is given up
RETRY_PAUSE_S = 0.5


def _ray() -> Any:
    import sys

    return sys.modules.get("ray")


def wanted(section: dict[str, Any]) -> bool:
    """Whether ``init`` with this section uses the plane on several nodes (see the module's text)."""
    backend = str(section.get("backend") or os.environ.get("PERSISTING_TQ_BACKEND") or "auto")
    if backend not in BACKENDS:
        raise ValueError(f"persisting.backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "broker":
        return False
    ray = _ray()
    up = ray is not None and ray.is_initialized()
    if backend == "ray":
        if not up:
            raise ValueError("persisting.backend=ray needs Ray: call ray.init(address=...) before tq.init()")
        return True
    if not up:
        return False
    try:
        ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE)
        return True
    except ValueError:
        return sum(1 for n in ray.nodes() if n.get("Alive")) > 1


class RoutedStore:
    """``KVStore``'s calls, each on the store of the node owning its partition. ``data`` is the data topic as a
    ``persisting.ray.Queue`` (routed by partition the same way), for the client's direct queue calls."""

    def __init__(self, section: dict[str, Any], directory: Any) -> None:
        self._ray = _ray()
        self._section = section
        self._directory = directory
        self._topic = str(section.get("topic") or "transfer_queue")
        self.node_id: str = self._ray.get_runtime_context().get_node_id()
        self._key = pray.node_key(self.node_id)
        self._routes: dict[str, tuple[str, str]] = {}
        self._local: dict[str, KVStore] = {}
        self._hosts: dict[str, Any] = {}
        objects = None if section.get("objects") == "codec" else "pickle"
        durability = str(section.get("durability") or "process")
        mode = dedup_mode(section)
        self.data = pray.Queue(self._topic, durability=durability, num_buckets=1, objects=objects, dedup=mode)

    async def aclose(self) -> None:
        for store in self._local.values():
            with contextlib.suppress(Exception):
                await store.aclose()
        self._local.clear()
        await self.data.aclose()

    # -- the KV calls (each passes what it is given on: ``KVStore``'s signatures are the contract) ----------------
    async def kv_batch_put(self, keys: list[str], partition: str, *rest: Any) -> Any:
        return await self._run(partition, "kv_batch_put", (keys, partition, *rest), claim=True)

    async def kv_batch_get(self, keys: list[str], partition: str, *rest: Any) -> Any:
        return await self._run(partition, "kv_batch_get", (keys, partition, *rest))

    async def kv_clear(self, keys: list[str], partition: str, *rest: Any) -> None:
        await self._run(partition, "kv_clear", (keys, partition, *rest))

    async def retrieve_meta(self, keys: list[str], partition: str, create: bool, *rest: Any) -> BatchMeta:
        return await self._run(partition, "retrieve_meta", (keys, partition, create, *rest), claim=create)

    async def retrieve_keys(self, indexes: list[int], partition: str, *rest: Any) -> list[str | None]:
        return await self._run(partition, "retrieve_keys", (indexes, partition, *rest))

    async def lookup(self, keys: list[str], partition: str, *rest: Any) -> Any:
        """``KVStore.lookup`` on the owner node (the engine's key index there)."""
        return await self._run(partition, "lookup", (keys, partition, *rest))

    async def get_data(self, partition: str, *rest: Any) -> Any:
        return await self._run(partition, "get_data", (partition, *rest))

    async def _tq_meta(self, partition: str, *rest: Any) -> BatchMeta:
        return await self._run(partition, "_tq_meta", (partition, *rest))

    async def put(self, data: Any, metadata: BatchMeta | None, partition: str | None) -> BatchMeta:
        named = metadata.partition_ids[0] if metadata is not None and metadata.size else partition
        if not named:
            raise ValueError("put needs metadata or a partition_id")
        return await self._run(named, "put", (data, metadata, partition), claim=True)

    async def kv_list(self, partition: str | None) -> dict[str, dict[str, Any]]:
        if partition is not None:
            return await self._run(partition, "kv_list", (partition,))
        # Every partition: each broker owning one of this topic's partitions lists its own (its key log holds
        # exactly those), all at once.
        owners = await pray.registry().owners.remote()
        keys = {k for name, k in owners["partitions"].items() if name.partition("/")[0] == self._topic}
        routes = [(k, owners["hosts"][k]) for k in sorted(keys)]
        listed = await asyncio.gather(*(self._on(route, "kv_list", (None,)) for route in routes))
        out: dict[str, dict[str, Any]] = {}
        for part in listed:
            out.update(part)
        return out

    # -- routing ------------------------------------------------------------------------------------
    async def _route(self, partition: str, claim: bool) -> tuple[str, str] | None:
        route = self._routes.get(partition)
        if route is None:
            reg = pray.registry()
            if claim:
                found = await reg.claim.remote(self._topic, partition, self._key)
            else:
                found = await reg.owner.remote(self._topic, partition, 0.0)
            if found is None:
                return None
            route = self._routes[partition] = (str(found[0]), str(found[1]))
        return route

    async def _run(self, partition: str, method: str, args: tuple[Any, ...], *, claim: bool = False) -> Any:
        route = await self._route(partition, claim)
        # Nobody owns it: no key of it exists anywhere, and this node's store answers so (found nothing, ...).
        route = route or (self._key, self.node_id)
        for attempt in range(CALL_ATTEMPTS):
            try:
                return await self._on(route, method, args)
            except self._ray.exceptions.RayActorError:
                if attempt == CALL_ATTEMPTS - 1:
                    raise
            # The owner's host died (Ray restarts it) or its node is gone: the registry moves the broker to a
            # live node if its node does not answer, and the call is made again where it is now.
            key, node = route
            moved = await pray.registry().relocate.remote(key, node, self.node_id)
            route = (key, str(moved))
            if partition in self._routes:
                self._routes[partition] = route
            self._hosts.pop(node, None)
            await asyncio.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _on(self, route: tuple[str, str], method: str, args: tuple[Any, ...]) -> Any:
        key, node = route
        if node == self.node_id:
            return await getattr(await self._local_store(key), method)(*args)
        host = await self._host(node)
        try:
            return unpack(await host.run.remote(key, method, tuple(pack(a) for a in args)), copy=True)
        except self._ray.exceptions.RayTaskError as exc:
            cause = exc.cause  # the call's own error (ValueError for a missing key, ...), as on one node
            if isinstance(cause, Exception):
                raise cause from None
            raise

    async def _local_store(self, key: str) -> KVStore:
        store = self._local.get(key)
        if store is None:
            address = await asyncio.to_thread(node_broker_address, self.node_id, key)
            store = self._local.setdefault(key, open_store(address, self._section))
        return store

    async def _host(self, node: str) -> Any:
        host = self._hosts.get(node)
        if host is None:
            try:
                host = self._ray.get_actor(host_name(node), namespace=NAMESPACE)
            except ValueError:
                host = (await self._directory.host.remote(node))[0]
            self._hosts[node] = host
        return host


class RayPlane:
    """This process's handle on the plane on several nodes (what ``interface.py`` holds, as ``node_broker.Plane``)."""

    def __init__(self, section: dict[str, Any], directory: Any, first: bool, started: bool) -> None:
        self.section = section
        self.metrics_endpoint: str | None = None
        self._directory = directory
        self._first = first
        self._started = started
        self.store = RoutedStore(section, directory)

    @property
    def owner(self) -> bool:
        """The run's first ``init``: its ``close`` stops the plane (``fresh`` clears at its start)."""
        return self._first

    def close(self) -> None:
        with contextlib.suppress(Exception):
            _engine.run(self.store.aclose())
        if not self._first:
            return
        ray = _ray()
        with contextlib.suppress(Exception):
            ray.get(self._directory.stop.remote())
        with contextlib.suppress(Exception):
            ray.kill(self._directory)
        if self._started:
            with contextlib.suppress(Exception):
                pray.stop()


def connect(section: dict[str, Any]) -> RayPlane:
    """Join the run's plane on several nodes, starting it (``persisting.ray`` and the directory) if needed."""
    ray = _ray()
    started = False
    try:
        directory = ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE)
    except ValueError:
        try:
            pray.registry()
        except Exception:  # no persisting.ray cluster yet: this first init starts it
            arena = int(section.get("arena_bytes") or DEFAULT_ARENA_BYTES)
            pray.start(os.path.abspath(storage_path(section)), arena_bytes=arena)
            started = True
        here = ray.get_runtime_context().get_node_id()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        directory = (
            ray.remote(Directory)
            .options(
                name=DIRECTORY_NAME,
                namespace=NAMESPACE,
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=8,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
            )
            .remote(section)
        )
    run_section, first = ray.get(directory.join.remote(f"{os.getpid()}-{uuid.uuid4().hex}"))
    return RayPlane(dict(run_section), directory, first, started and first)
