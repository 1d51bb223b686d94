"""Start, find and stop the cluster's brokers: one actor per node, pinned there, and the registry.

``start(storage_root)`` runs in a driver connected to Ray (``ray.init(address=...)``): it places the registry
on the driver's node and one ``NodeBroker`` actor on every alive node, each with node-affinity scheduling
(``soft=False``: an actor never runs anywhere but its node), named ``persisting-node-<node id>`` in the
namespace ``persisting``, so any task finds its own node's broker by its node id. Each node's broker gets its
own storage path ``<storage_root>/<key>``, its own socket and so its own arena file.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..errors import BrokerUnavailableError, ConfigError
from .node import NodeBroker
from .registry import Registry

NAMESPACE = "persisting"
REGISTRY_NAME = "persisting-registry"
DEFAULT_ARENA_BYTES = 256 * 1024 * 1024
ACTOR_CONCURRENCY = 32  # calls one node's actor serves at once (waiting takes hold a thread each)
START_TIMEOUT_S = 120.0
# Handles of the actors start() made: Ray ends an actor (named or not) once no handle to it is left, unless it
# is detached, so the driver that started the cluster keeps them until stop().
_started: list[Any] = []


def node_key(node_id: str) -> str:
    """The key of the broker a node starts: short, for the socket path and the storage folder."""
    return f"n-{node_id[:16]}"


def actor_name(node_id: str) -> str:
    return f"persisting-node-{node_id}"


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("persisting.ray needs Ray: pip install 'persisting[ray]'") from exc
    if not ray.is_initialized():
        raise ConfigError("persisting.ray: connect to the Ray cluster first (ray.init(address=...))")
    return ray


def start(
    storage_root: str, *, arena_bytes: int = DEFAULT_ARENA_BYTES, log_dir: str | None = None, detached: bool = False
) -> dict[str, str]:
    """One broker per alive node (nodes that have one already keep it) and the registry; {node id: address}.

    ``storage_root``: a folder; node ``N``'s broker stores under ``<storage_root>/<key of N>``. When it is on a
    file system every node mounts (NFS, a shared disk), a live node can adopt the broker of a node that is
    gone (see ``registry.Registry.relocate``); on node-local disks the partitions of a lost node are lost with
    it (their acknowledged samples are on that disk).

    ``detached=False``: the brokers live as long as this driver (Ray ends them with it); ``True``: until
    ``stop()``, whoever calls it."""
    if "://" in storage_root:
        raise ConfigError(
            f"persisting.ray takes a folder as storage_root, got {storage_root!r}; object-store URIs need one "
            "local_path per node and are not supported by the Ray cluster yet"
        )
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    registry = ray.remote(Registry).options(
        name=REGISTRY_NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        num_cpus=0,
        lifetime="detached" if detached else None,
        scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
    )
    reg = registry.remote()
    _started.append(reg)
    logs = log_dir or os.path.join(tempfile.gettempdir(), f"persisting-ray-{os.getuid()}", "logs")
    pending = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        key = node_key(node_id)
        storage = os.path.join(os.path.abspath(storage_root), key)
        actor = (
            ray.remote(NodeBroker)
            .options(
                name=actor_name(node_id),
                namespace=NAMESPACE,
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=ACTOR_CONCURRENCY,
                lifetime="detached" if detached else None,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(node_id, key, storage, arena_bytes, logs)
        )
        pending[node_id] = (actor, key, storage)
        _started.append(actor)
    out = {}
    for node_id, (actor, key, storage) in pending.items():
        out[node_id] = ray.get(actor.addresses.remote(), timeout=START_TIMEOUT_S)[key]
        ray.get(reg.register.remote(key, node_id, storage))
    return out


def node_actor(node_id: str, *, missing_ok: bool = False) -> Any:
    """The ``NodeBroker`` actor of ``node_id`` (None when it has none and ``missing_ok``)."""
    ray = _ray()
    try:
        return ray.get_actor(actor_name(node_id), namespace=NAMESPACE)
    except ValueError as exc:
        if missing_ok:
            return None
        raise BrokerUnavailableError(
            f"node {node_id} runs no persisting broker actor; call persisting.ray.start() after adding nodes"
        ) from exc


def registry() -> Any:
    ray = _ray()
    try:
        return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
    except ValueError as exc:
        raise BrokerUnavailableError("no persisting cluster is running: call persisting.ray.start() first") from exc


def stop() -> dict[str, Any]:
    """Stop every node's brokers cleanly (they flush), then the actors and the registry; exit status by key."""
    ray = _ray()
    statuses: dict[str, Any] = {}
    for node in ray.nodes():
        actor = node_actor(node["NodeID"], missing_ok=True) if node.get("Alive") else None
        if actor is None:
            continue
        try:
            statuses.update(ray.get(actor.stop.remote(), timeout=START_TIMEOUT_S))
        except ray.exceptions.RayActorError:
            continue  # its node went since ray.nodes() was read: its brokers died with it (PDEATHSIG)
        ray.kill(actor)
    ray.kill(registry())
    _started.clear()
    return statuses
