"""Who owns what: the cluster's one registry of partitions, brokers and the nodes that host them.

A plain class; ``cluster.py`` makes it an async Ray actor named ``persisting-registry``, pinned to the head node.

- Placement: a partition is owned by a *broker* (named by a key; each node starts one with its own storage
  path). The first ``claim`` wins: a producer's first put claims the partition for its own node's broker, so
  tensors are written into that node's arena and consumers elsewhere fetch them. Consumers never claim; they
  wait (``owner(..., timeout_s)``) until a producer has.
- Movement: ownership never moves while its broker's node lives (the consumption state is in that broker's log).
  A broker's *host* moves when its node is gone: ``relocate`` has a live node adopt the broker (start it on the
  same storage path) and every partition of that broker follows: with its log and consumption state on a shared
  folder; on object storage with what it had flushed only (``storage.py``).
- Recovery: the registry lives in memory on the head node; losing the head loses the Ray cluster anyway.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import BrokerUnavailableError, ConfigError
from . import actors

PING_TIMEOUT_S = 5.0  # a host that does not answer a ping in this time is taken for gone when a client says so


class Registry:
    def __init__(self) -> None:
        self._owners: dict[tuple[str, str], str] = {}  # (topic, partition) -> broker key
        self._hosts: dict[str, str] = {}  # broker key -> node id of the actor hosting it
        self._storage: dict[str, str] = {}  # broker key -> storage path
        self._changed = asyncio.Event()
        self._relocating: dict[str, asyncio.Lock] = {}

    async def register(self, key: str, node_id: str, storage_path: str) -> None:
        self._hosts[key] = node_id
        self._storage[key] = storage_path
        self._notify()

    async def claim(self, topic: str, partition: str, key: str) -> tuple[str, str]:
        """The owner of (topic, partition): ``key`` if nobody had it. Returns (broker key, host node id)."""
        if key not in self._hosts:
            raise ConfigError(f"no broker {key!r} is registered; start the cluster with persisting.ray.start()")
        owner = self._owners.setdefault((topic, partition), key)
        self._notify()
        return owner, self._hosts[owner]

    async def owner(self, topic: str, partition: str, timeout_s: float = 0.0) -> tuple[str, str] | None:
        """(broker key, host node id) of the partition, waiting up to ``timeout_s`` for a claim; None if none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (topic, partition) not in self._owners:
            left = deadline - loop.time()
            if left <= 0:
                return None
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return None
        key = self._owners[(topic, partition)]
        return key, self._hosts[key]

    async def owners(self) -> dict[str, Any]:
        return {
            "partitions": {f"{t}/{p}": k for (t, p), k in self._owners.items()},
            "hosts": dict(self._hosts),
            "storage": dict(self._storage),
        }

    async def relocate(self, key: str, gone_node: str, to_node: str) -> str:
        """Broker ``key`` was hosted on ``gone_node``, which a client found unreachable: have ``to_node``'s actor
        adopt it on the same storage path: a shared folder brings its log, arena file and consumption state along;
        on object storage the adopter uses a fresh local folder and takes each topic over once the dead writer's
        lease ran out (clients wait for it). Returns the node now hosting it (another client may have moved it)."""
        lock = self._relocating.setdefault(key, asyncio.Lock())
        async with lock:
            if self._hosts.get(key) != gone_node:
                return self._hosts[key]
            old = actors.node_actor(gone_node, missing_ok=True)
            if old is not None:
                try:
                    await asyncio.wait_for(_awaitable(old.ping.remote()), PING_TIMEOUT_S)
                    return gone_node  # it answers: not gone, the caller's failure was something else
                except Exception:  # any failure to answer means the host is gone
                    pass
            new = actors.node_actor(to_node, missing_ok=False)
            if new is None:
                raise BrokerUnavailableError(f"node {to_node} has no persisting actor to adopt broker {key!r}")
            await _awaitable(new.adopt.remote(key, self._storage[key]))
            self._hosts[key] = to_node
            self._notify()
            return to_node

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


async def _awaitable(ref: Any) -> Any:
    return await ref
