"""The Ray actors of the layer on several nodes: the run's directory, and one KV host per node.

- ``Directory`` (named ``persisting-tq``, namespace ``persisting``, on the node of the first ``init``): the run's
  ``persisting`` conf section, which process is the run's first (it stops the plane in ``close()``), and the KV
  host of each node, made on demand. It owns the hosts, so a kill -9 of the worker that first needed a node's
  host does not end that host (Ray ends an actor with the process that made it).
- ``KVHost`` (named ``persisting-tq-host-<node id>``, pinned to its node, restarted by Ray if it dies): the
  ``KVStore`` of each broker its node hosts (its own, and one adopted from a lost node), over ipc. A KV call that
  a process on another node makes on a partition this node owns runs here, next to the partition's data and key
  log, in one Ray call; its arguments and answer cross nodes through Ray's object store.

Plain classes; ``ray_plane.py`` makes them actors. A TensorDict crosses nodes as ``Columns``: its tensor columns
as numpy arrays (jagged ones as values + offsets, ``persisting.ray.transfer``), which Ray stores out of band with
no pickling of their bytes, and its Python objects as a list (pickled by Ray, as the layer's BatchMeta and tags
are: the processes of one Ray cluster trust each other, as they do with TransferQueue). A TensorDict read from
another node is rebuilt over a private copy of the arrays (one memcpy), so verl may write into it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from ... import ray as pray
from ...ray import transfer
from .. import _engine
from .config import open_store
from .store import KVStore

# The KVStore calls a process on another node may have run here (``ray_plane.RoutedStore`` names the partition
# each one is routed by); nothing else runs from a remote call.
ROUTES = frozenset(
    {"kv_batch_put", "kv_batch_get", "kv_clear", "kv_list", "retrieve_meta", "retrieve_keys", "get_data", "put"}
    | {"_tq_meta", "lookup"}
)
NAMESPACE = "persisting"
DIRECTORY_NAME = "persisting-tq"
HOST_CONCURRENCY = 16  # KV calls one node's host serves at once (each blocks a thread on the engine loop)


def host_name(node_id: str) -> str:
    return f"persisting-tq-host-{node_id}"


class Directory:
    def __init__(self, section: dict[str, Any]) -> None:
        self._section = dict(section)
        self._first: str | None = None
        self._hosts: dict[str, Any] = {}
        self._lock = threading.Lock()

    def join(self, process: str) -> tuple[dict[str, Any], bool]:
        """The run's section, and whether ``process`` is the run's first (the one whose ``close`` stops it)."""
        with self._lock:
            if self._first is None:
                self._first = process
            return self._section, self._first == process

    def host(self, node_id: str) -> list[Any]:
        """Node ``node_id``'s KV host (made if it has none); in a list, so Ray hands back the handle itself."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            host = self._hosts.get(node_id)
            if host is None:
                host = (
                    ray.remote(KVHost)
                    .options(
                        name=host_name(node_id),
                        namespace=NAMESPACE,
                        get_if_exists=True,
                        num_cpus=0,
                        max_concurrency=HOST_CONCURRENCY,
                        max_restarts=-1,  # a killed host comes back on its node; callers make the call again
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    )
                    .remote(node_id, self._section)
                )
                self._hosts[node_id] = host
            return [host]

    def stop(self) -> None:
        import ray

        with self._lock:
            for host in self._hosts.values():
                ray.kill(host)
            self._hosts.clear()


class KVHost:
    def __init__(self, node_id: str, section: dict[str, Any]) -> None:
        self.node_id = node_id
        self._section = section
        self._stores: dict[str, KVStore] = {}
        self._lock = threading.Lock()

    def run(self, key: str, method: str, args: tuple[Any, ...]) -> Any:
        """``KVStore.<method>(*args)`` on broker ``key``'s store (a method ``ray_plane.ROUTES`` names)."""
        if method not in ROUTES:
            raise ValueError(f"{method!r} is not a KV call another node may make here; one of {sorted(ROUTES)}")
        args = tuple(unpack(a, copy=False) for a in args)  # only read here: written to the broker as they are
        return pack(_engine.run(getattr(self._store(key), method)(*args)))

    def ping(self) -> str:
        return self.node_id

    def pid(self) -> int:
        return os.getpid()

    def _store(self, key: str) -> KVStore:
        with self._lock:
            store = self._stores.get(key)
            if store is None:
                store = self._stores[key] = open_store(node_broker_address(self.node_id, key), self._section)
            return store


def node_broker_address(node_id: str, key: str) -> str:
    """The address of broker ``key`` hosted on node ``node_id`` (its own, or one it adopted)."""
    import ray

    addresses = ray.get(pray.node_actor(node_id).addresses.remote())
    if key not in addresses:
        raise ConnectionError(f"node {node_id} hosts no broker {key!r} (it hosts {sorted(addresses)})")
    return str(addresses[key])


@dataclass
class Columns:
    """A TensorDict of ``rows`` samples as it crosses nodes (see the module's text); ``order``: its column names."""

    rows: int
    order: list[str]
    arrays: dict[str, Any]
    kinds: dict[str, str]
    objects: dict[str, list[Any]]


def pack(value: Any) -> Any:
    """``value`` as ``Columns`` if it is a flat TensorDict of tensors and NonTensorStacks; else as it is."""
    if type(value).__name__ != "TensorDict" or len(value.batch_size) != 1:
        return value
    import torch
    from tensordict import NonTensorStack

    tensors: dict[str, Any] = {}
    objects: dict[str, list[Any]] = {}
    for name in value.keys():  # noqa: SIM118 (iterating a TensorDict walks its rows)
        column = value.get(name)
        if isinstance(column, NonTensorStack):
            objects[name] = column.tolist()
        elif isinstance(column, torch.Tensor) and (not column.is_nested or column.layout == torch.jagged):
            tensors[name] = column
        else:  # a strided nested tensor, a nested TensorDict, ...: Ray pickles the whole TensorDict
            return value
    arrays, kinds = transfer.pack(tensors)
    return Columns(int(value.batch_size[0]), list(value.keys()), arrays, kinds, objects)


def unpack(value: Any, *, copy: bool) -> Any:
    """The TensorDict ``pack`` made ``Columns`` of (anything else as it is); ``copy``: over private memory."""
    if not isinstance(value, Columns):
        return value
    from tensordict import NonTensorStack, TensorDict

    arrays = value.arrays
    if copy:
        arrays = {n: [a[0].copy(), a[1].copy(), a[2]] if isinstance(a, list) else a.copy() for n, a in arrays.items()}
    tensors = transfer.unpack(arrays, value.kinds)
    columns = {n: tensors[n] if n in tensors else NonTensorStack(*value.objects[n]) for n in value.order}
    return TensorDict(columns, batch_size=[value.rows])
