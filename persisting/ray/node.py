"""The actor on each node: it runs that node's broker(s) and serves the calls other nodes make on them.

A plain class; ``cluster.py`` makes it a Ray actor (threaded, pinned to its node). It hosts brokers by *key*:
its own node's broker, and any broker it adopted from a node that is gone (``adopt``): on the same storage path;
with an object store, in a fresh local folder of this node (``storage.BrokerStorage.local_path``). A call from
another node names the key, the topic and a ``Queue`` method: the actor runs that method on its ``SyncQueue``
over the local broker (so the take, its consumption state and its request key stay with the owner's broker) and
returns the result, whose arrays Ray stores once in this node's object store for the caller to fetch.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ..client.sync import SyncQueue
from ..errors import ConfigError
from . import transfer
from .broker_process import BrokerProcess, socket_address
from .methods import REMOTE_METHODS
from .storage import BrokerStorage


class NodeBroker:
    """The brokers hosted on one node, by key, and the queues this actor holds on them."""

    def __init__(self, node_id: str, key: str, storage: BrokerStorage, arena_bytes: int, log_dir: str) -> None:
        self.node_id = node_id
        self.key = key
        self._storage = storage
        self._arena_bytes = arena_bytes
        self._log_dir = Path(log_dir)
        self._brokers: dict[str, BrokerProcess] = {}
        self._queues: dict[tuple[str, str], SyncQueue] = {}
        self._lock = threading.Lock()
        self.adopt(key, storage.storage_path(key))

    def adopt(self, key: str, storage_path: str) -> str:
        """Host broker ``key`` on ``storage_path`` here (started if not yet); its address."""
        with self._lock:
            broker = self._brokers.get(key)
            if broker is None:
                self._log_dir.mkdir(parents=True, exist_ok=True)
                local = self._storage.local_path(key, self.key)
                logfile = self._log_dir / (f"{key}.log" if key == self.key else f"{key}.on-{self.key}.log")
                broker = BrokerProcess(
                    storage_path, socket_address(key), self._arena_bytes, logfile, local, self._storage.env()
                )
                broker.start()
                self._brokers[key] = broker
            return broker.address

    def ping(self) -> str:
        return self.node_id

    def addresses(self) -> dict[str, str]:
        return {key: b.address for key, b in self._brokers.items()}

    def local_paths(self) -> dict[str, str | None]:
        """The local folder of each broker hosted here (None: a folder root holds everything)."""
        return {key: b.local_path for key, b in self._brokers.items()}

    def broker_pid(self, key: str, timeout_s: float = 30.0) -> int:
        """The running broker's pid (waits for a restart to finish)."""
        return self._broker(key).wait_running(timeout_s)

    def restarts(self, key: str) -> int:
        return self._broker(key).restarts

    def actor_pid(self) -> int:
        return os.getpid()

    def call(self, key: str, topic: str, options: dict[str, Any], method: str, args: tuple[Any, ...], kw: Any) -> Any:
        """Run ``Queue.<method>(*args, **kw)`` on topic ``topic`` of broker ``key``; tensors packed for Ray."""
        if method not in REMOTE_METHODS:
            allowed = sorted(REMOTE_METHODS)
            raise ConfigError(f"{method!r} cannot be called on another node's broker; use one of {allowed}")
        queue = self._queue(key, topic, options)
        if method == "put" and args:
            args = (transfer.unpack(*args[0]), *args[1:])
        if method == "kv_put":
            args, kw = transfer.unpack_argument(args, kw, 1, "data")
        result = getattr(queue, method)(*args, **kw)
        if method == "kv_get":
            data, meta = result
            return (None if data is None else transfer.pack(data)), meta
        if method == "get_data":
            return transfer.pack(result)
        if method == "get_batch":
            data, meta = result
            return transfer.pack(data), meta
        return result

    def stop(self) -> dict[str, int | None]:
        """Close the queues and stop every broker cleanly (each flushes its topics); their exit statuses."""
        with self._lock:
            for queue in self._queues.values():
                queue.close()
            self._queues.clear()
            return {key: broker.stop() for key, broker in self._brokers.items()}

    def _broker(self, key: str) -> BrokerProcess:
        broker = self._brokers.get(key)
        if broker is None:
            raise ConfigError(f"node {self.node_id} hosts no broker {key!r} (it hosts {sorted(self._brokers)})")
        return broker

    def _queue(self, key: str, topic: str, options: dict[str, Any]) -> SyncQueue:
        with self._lock:
            queue = self._queues.get((key, topic))
            if queue is None:
                queue = SyncQueue(topic, broker=self._broker(key).address, **options)
                self._queues[(key, topic)] = queue
            return queue
