"""The names of the cluster's Ray actors and how to find them: a leaf that ``cluster`` (which starts them), the
registry (which moves a broker to another node's actor) and the Ray ``Queue`` share.

Each node's ``NodeBroker`` actor is named ``persisting-node-<node id>``, the registry ``persisting-registry``,
both in the namespace ``persisting``; ``cluster.py`` says how they are started.
"""

from __future__ import annotations

from typing import Any

from ..errors import BrokerUnavailableError, ConfigError

NAMESPACE = "persisting"
REGISTRY_NAME = "persisting-registry"


def node_key(node_id: str) -> str:
    """The key of the broker a node starts: short, for the socket path and the storage folder."""
    return f"n-{node_id[:16]}"


def actor_name(node_id: str) -> str:
    return f"persisting-node-{node_id}"


def connected_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "persisting.ray needs Ray: the ray extra (in a checkout of persisting: pip install '.[ray]')"
        ) from exc
    if not ray.is_initialized():
        raise ConfigError("persisting.ray: connect to the Ray cluster first (ray.init(address=...))")
    return ray


def node_actor(node_id: str, *, missing_ok: bool = False) -> Any:
    """The ``NodeBroker`` actor of ``node_id`` (None when it has none and ``missing_ok``)."""
    ray = connected_ray()
    try:
        return ray.get_actor(actor_name(node_id), namespace=NAMESPACE)
    except ValueError as exc:
        if missing_ok:
            return None
        raise BrokerUnavailableError(
            f"node {node_id} runs no persisting broker actor; call persisting.ray.start() after adding nodes"
        ) from exc


def registry() -> Any:
    ray = connected_ray()
    try:
        return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
    except ValueError as exc:
        raise BrokerUnavailableError("no persisting cluster is running: call persisting.ray.start() first") from exc
