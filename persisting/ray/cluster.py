"""Start, find and stop the cluster's brokers: one actor per node, pinned there, and the registry.

``start(storage_root)`` runs in a driver connected to Ray (``ray.init(address=...)``): it places the registry
on the driver's node and one ``NodeBroker`` actor on every alive node, each with node-affinity scheduling
(``soft=False``: an actor never runs anywhere but its node), named ``persisting-node-<node id>`` in the
namespace ``persisting``, so any task finds its own node's broker by its node id. Each node's broker gets its
own storage path ``<storage_root>/<key>`` (a folder, or a prefix of an object store with a local folder
``<local_root>/<key>`` on its node: ``storage.py``), its own socket and so its own arena file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from .actors import NAMESPACE, REGISTRY_NAME, actor_name, connected_ray, node_key
from .actors import node_actor as node_actor
from .actors import registry as registry
from .node import NodeBroker
from .registry import Registry
from .storage import broker_storage

DEFAULT_ARENA_BYTES = 256 * 1024 * 1024
ACTOR_CONCURRENCY = 32  # calls one node's actor serves at once (waiting takes hold a thread each)
START_TIMEOUT_S = 120.0
# Handles of the actors start() made: Ray ends an actor (named or not) once no handle to it is left, unless it
# is detached, so the driver that started the cluster keeps them until stop().
_started: list[Any] = []


def start(
    storage_root: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    local_root: str | None = None,
    arena_bytes: int = DEFAULT_ARENA_BYTES,
    log_dir: str | None = None,
    detached: bool = False,
) -> dict[str, str]:
    """One broker per alive node (nodes that have one already keep it) and the registry; {node id: address}.

    ``storage_root``: a folder, or an object-store URI (``s3://bucket/prefix``, ``gs://...``, ``az://...``); node
    ``N``'s broker stores under ``<storage_root>/<key of N>``.

    - A folder on a file system every node mounts (NFS, a shared disk): a live node adopts the broker of a node
      that is gone on the same folder, log and consumption state included (``registry.Registry.relocate``). On
      node-local disks the partitions of a lost node are lost with it.
    - An object-store URI: ``storage_options`` are Lance's (else ``PERSISTING_STORAGE_OPTIONS`` of this
      driver), passed to each broker in its environment; each broker keeps its log in ``<local_root>/<key>`` on
      its node (``local_root``: else ``PERSISTING_LOCAL_PATH``, else the URI's default local folder). A live
      node adopts a lost node's broker on the same prefix with a fresh local folder: after the dead writer's
      lease (``PERSISTING_OWNER_LEASE_S``) it serves every flushed record; the lost node's unflushed records
      and its consumption state are gone (docs: Guides, "More than one node").

    ``detached=False``: the brokers live as long as this driver (Ray ends them with it); ``True``: until
    ``stop()``, whoever calls it."""
    storage = broker_storage(storage_root, storage_options, local_root)
    ray = connected_ray()
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
        pending[node_id] = (actor, key, storage.storage_path(key))
        _started.append(actor)
    out = {}
    for node_id, (actor, key, path) in pending.items():
        out[node_id] = ray.get(actor.addresses.remote(), timeout=START_TIMEOUT_S)[key]
        ray.get(reg.register.remote(key, node_id, path))
    return out


def stop() -> dict[str, Any]:
    """Stop every node's brokers cleanly (they flush), then the actors and the registry; exit status by key."""
    ray = connected_ray()
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
