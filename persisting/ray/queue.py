"""``persisting.ray.Queue``: the ``Queue`` API from any node of the Ray cluster.

Each call names a partition; the registry says which broker owns it and which node hosts that broker. On this
node: the plain broker-mode ``Queue`` over ipc (tensors as arena views, as on one node). On another node: a call
on that node's actor, which runs the same method on its own broker; arrays come back through Ray's object store
(``transfer.py``). A producer's first put claims the partition for its own node's broker; a consumer waits for
a claim (``wait=True``) or gets an empty batch. An owner that cannot be reached (its node gone) is moved to a
live node by the registry, and the call is made again there once. On object storage the moved broker opens the
topic as another writer: its engine refuses (``TopicLockedError``) until the dead writer's lease ran out, and the
call is made again until then (``PERSISTING_OWNER_LEASE_S`` plus ``TAKEOVER_SLACK_S``).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..client.queue import Queue as LocalQueue
from ..errors import BrokerUnavailableError, ConfigError, TopicLockedError
from ..tensors import tensordicts
from ..tensors.meta import BatchMeta
from . import actors, transfer
from .methods import ROUTED

RELOCATE_ATTEMPTS = 2  # an owner moved once can be gone again before the call lands; then give up
# A moved broker's topic is refused while the dead writer's lease runs (at most the lease after its last renewal);
# past the lease and this slack the holder is alive after all (a partitioned node): the refusal is raised.
TAKEOVER_SLACK_S = 10.0
TAKEOVER_POLL_S = 0.5


def _routed(name: str, *, claim: bool = False) -> Callable[..., Any]:
    """``Queue.<name>`` made on the broker owning the partition the call names: its ``partition_id`` argument if
    it is a str, else the one partition of its ``BatchMeta`` argument. ``claim``: a call that writes, so its
    partition is claimed for this node's broker if nobody owns it yet. A call on a partition nobody owns (and that
    does not claim) returns None. The names are ``methods.ROUTED``."""
    signature = inspect.signature(getattr(LocalQueue, name))

    async def call(self: Queue, *args: Any, **kw: Any) -> Any:
        try:
            bound = signature.bind(None, *args, **kw)
        except TypeError as exc:
            raise ConfigError(f"persisting.ray.Queue.{name}: {exc}") from exc
        bound.apply_defaults()
        return await self._call(_partition_of(name, bound.arguments), name, args, kw, claim=claim)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``Queue.{name}`` on the broker owning the partition. " + (getattr(LocalQueue, name).__doc__ or "")
    return call


def _partition_of(name: str, arguments: Mapping[str, Any]) -> str:
    partition = arguments.get("partition_id")
    if isinstance(partition, str):
        return partition
    for value in arguments.values():
        if isinstance(value, BatchMeta):
            return _one(value)
    raise ConfigError(f"persisting.ray.Queue.{name} names no partition: pass partition_id= or a BatchMeta")


class Queue:
    """Topic ``name`` across the cluster; ``options`` are ``Queue``'s (``num_buckets``, ``durability``, ...) and
    apply wherever the topic is opened (every owner's broker)."""

    def __init__(self, name: str, **options: Any) -> None:
        if "broker" in options or "storage_path" in options:
            raise ConfigError("persisting.ray.Queue picks the brokers itself: drop broker= and storage_path=")
        self.name = name
        self._options = options
        self._ray = actors.connected_ray()
        self.node_id: str = self._ray.get_runtime_context().get_node_id()
        self._routes: dict[str, tuple[str, str]] = {}
        self._local: dict[str, LocalQueue] = {}

    def __repr__(self) -> str:
        return f"persisting.ray.Queue({self.name!r}, node={self.node_id[:12]})"

    async def put(self, data: Any, partition_id: str = "default", **kw: Any) -> Any:
        """Store a tensor batch (or ``batch_meta=`` fields of samples) in ``partition_id``; claims it for this
        node's broker if nobody owns it yet."""
        return await self._call(partition_id, "put", (data, partition_id), kw, claim=True)

    async def get_meta(
        self,
        fields: Sequence[str] | None = None,
        batch_size: int = 1,
        task_name: str = "default",
        partition_id: str = "default",
        sampler: Any = None,
        **kw: Any,
    ) -> BatchMeta:
        args = (fields, batch_size, task_name, partition_id, sampler)
        result = await self._call(partition_id, "get_meta", args, kw, wait=_wait_s(kw))
        return BatchMeta() if result is None else result

    async def get_data(
        self, batch_meta: BatchMeta, partition_id: str | None = None, device: Any = None, **kw: Any
    ) -> Any:
        partitions = batch_meta.partition_ids
        if len(partitions) > 1:
            raise ConfigError(f"get_data of one partition at a time here; this BatchMeta holds {partitions}")
        if not partitions:
            return {}
        return await self._call(partitions[0], "get_data", (batch_meta, partition_id, device), kw)

    async def get_batch(
        self,
        fields: Sequence[str] | None = None,
        batch_size: int = 1,
        task_name: str = "default",
        partition_id: str = "default",
        sampler: Any = None,
        device: Any = None,
        **kw: Any,
    ) -> tuple[Any, BatchMeta]:
        args = (fields, batch_size, task_name, partition_id, sampler, device)
        result = await self._call(partition_id, "get_batch", args, kw, wait=_wait_s(kw))
        return ({}, BatchMeta()) if result is None else result

    async def clear(self, global_indexes: Any = None, partition_id: str = "default") -> int:
        result = await self._call(partition_id, "clear", (global_indexes, partition_id), {})
        return 0 if result is None else int(result)

    async def flush(self) -> None:
        """Flush this topic on every broker that owns one of its partitions."""
        owners = await self._ray_call(actors.registry().owners.remote())
        firsts: dict[str, str] = {}
        for name, key in owners["partitions"].items():
            topic, _, partition = name.partition("/")
            if topic == self.name:
                firsts.setdefault(key, partition)
        await asyncio.gather(*(self._call(partition, "flush", (), {}) for partition in firsts.values()))

    async def owner(self, partition_id: str) -> str | None:
        """The node id hosting the broker that owns ``partition_id`` (None: nobody put to it yet)."""
        route = await self._route(partition_id, claim=False, wait_s=0.0)
        return None if route is None else route[1]

    async def aclose(self) -> None:
        for queue in self._local.values():
            await queue.aclose()
        self._local.clear()

    async def _ray_call(self, ref: Any) -> Any:
        return await ref

    async def _route(self, partition: str, *, claim: bool, wait_s: float | None) -> tuple[str, str] | None:
        route = self._routes.get(partition)
        if route is not None:
            return route
        reg = actors.registry()
        if claim:
            route = await self._ray_call(reg.claim.remote(self.name, partition, actors.node_key(self.node_id)))
        else:
            limit = 365 * 86400.0 if wait_s is None else wait_s
            route = await self._ray_call(reg.owner.remote(self.name, partition, limit))
        if route is not None:
            self._routes[partition] = route = (route[0], route[1])
        return route

    async def _call(
        self,
        partition: str,
        method: str,
        args: tuple[Any, ...],
        kw: dict[str, Any],
        *,
        claim: bool = False,
        wait: float | None = 0.0,
    ) -> Any:
        route = await self._route(partition, claim=claim, wait_s=wait)
        if route is None:
            return None
        for _ in range(RELOCATE_ATTEMPTS):
            key, node = route
            try:
                return await self._taking_over(key, node, method, args, kw)
            except (BrokerUnavailableError, self._ray.exceptions.RayActorError):
                moved = await self._ray_call(actors.registry().relocate.remote(key, node, self.node_id))
                route = self._routes[partition] = (key, moved)
        raise BrokerUnavailableError(f"the owner of partition {partition!r} of {self.name!r} cannot be reached")

    async def _taking_over(self, key: str, node: str, method: str, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        """The call on broker ``key`` hosted by ``node``, made again while its engine is refused the topic's lease
        (a broker moved here from a lost node, before that node's lease on the object store ran out). A refused
        open takes nothing and stores nothing, so making it again is safe."""
        deadline: float | None = None
        while True:
            try:
                if node == self.node_id:
                    queue = await self._local_queue(key)
                    return await getattr(queue, method)(*args, **kw)
                return await self._remote(key, node, method, args, dict(kw))  # a copy: _remote takes keys out
            except TopicLockedError:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + _owner_lease_s() + TAKEOVER_SLACK_S
                if now >= deadline:
                    raise
                await asyncio.sleep(TAKEOVER_POLL_S)

    async def _remote(self, key: str, node: str, method: str, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        local_only = {k: kw.pop(k) for k in ("as_tensordict",) if k in kw}
        device = None
        if method in ("get_data", "get_batch"):
            device, args = args[-1], (*args[:-1], None)  # move to a device here, never on the owner
        if method == "put":
            if not isinstance(args[0], Mapping):
                raise ConfigError("a put to another node's partition takes a mapping of arrays (not a reservation)")
            args = (transfer.pack(args[0]), *args[1:])
        if method == "kv_get":
            device = kw.pop("device", None)
            local_only = {"as_tensordict": bool(self._options.get("as_tensordict"))}
        if method == "kv_put":
            args, kw = transfer.pack_argument(args, kw, 1, "data")
        actor = actors.node_actor(node)
        result = await self._ray_call(actor.call.remote(key, self.name, self._options, method, args, kw))
        if method == "kv_get":
            packed, meta = result
            return (None if packed is None else _arrived(packed, device, local_only, meta.size)), meta
        if method == "get_data":
            return _arrived(result, device, local_only)
        if method == "get_batch":
            packed, meta = result
            return _arrived(packed, device, local_only, meta.size), meta
        return result

    async def _local_queue(self, key: str) -> LocalQueue:
        queue = self._local.get(key)
        if queue is None:
            addresses = await self._ray_call(actors.node_actor(self.node_id).addresses.remote())
            queue = LocalQueue(self.name, broker=addresses[key], **self._options)
            await queue.open()
            self._local[key] = queue
        return queue


for _name, _writes in ROUTED.items():
    setattr(Queue, _name, _routed(_name, claim=_writes))


def _arrived(packed: tuple[dict[str, Any], dict[str, str]], device: Any, kw: dict[str, Any], n: int = -1) -> Any:
    arrays, kinds = packed
    data = transfer.unpack(arrays, kinds)
    if device is not None:  # torch fields move to the device here, as get_data(device=...) does on one node
        for name in kinds:
            value = data[name]
            data[name] = [t.to(device) for t in value] if isinstance(value, list) else value.to(device)
    if kw.get("as_tensordict"):
        return tensordicts.to_tensordict(data, n if n >= 0 else _rows(data))
    return data


def _owner_lease_s() -> float:
    """The writer's lease on an object-store topic, as this node's brokers see it (the same environment)."""
    from ..engine import object_store  # Lance: only once a moved broker was refused

    return float(object_store.LEASE_SECONDS)


def _rows(data: Mapping[str, Any]) -> int:
    return len(next(iter(data.values()))) if data else 0


def _wait_s(kw: Mapping[str, Any]) -> float | None:
    if not kw.get("wait"):
        return 0.0
    timeout = kw.get("timeout")
    return None if timeout is None else float(timeout)


def _one(meta: BatchMeta) -> str:
    partitions = meta.partition_ids
    if len(partitions) != 1:
        raise ConfigError(f"this call takes samples of one partition; the BatchMeta holds {partitions}")
    return str(partitions[0])
