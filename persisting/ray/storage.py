"""Where the cluster's brokers store: a shared folder, or an object-store URI with a local folder on each node.

``start(storage_root, storage_options=..., local_root=...)`` checks the root once (``engine.parse_location``: the
same URIs and errors as a single broker) and hands every node's actor one ``BrokerStorage``. Broker ``key``
stores under ``<root>/<key>``. With an object store, its write-ahead log and consumption log stay in a local
folder of the node that hosts it: ``<local_root>/<key>`` on its own node, and a *fresh* one,
``<local_root>/<key>.on-<host key>``, on a node that adopted it after its own node was lost: the adopter never
replays a log it did not write, and its engine takes the topic's lease in the object store as another node
(after the dead writer's lease ran out), then serves every flushed record (``engine/object_store.py``).

The options (credentials) reach a broker through the environment of its subprocess
(``PERSISTING_STORAGE_OPTIONS``), never its command line; they are never in a repr or a log line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine import parse_location

OPTIONS_ENV = "PERSISTING_STORAGE_OPTIONS"


@dataclass(frozen=True)
class BrokerStorage:
    """``root``: an absolute folder, or an object-store URI (no trailing slash); ``local_root``: with a URI, the
    folder on each node under which its brokers keep their logs (None for a folder root)."""

    root: str
    local_root: str | None = None
    options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def remote(self) -> bool:
        return self.local_root is not None

    def storage_path(self, key: str) -> str:
        """Where broker ``key`` stores (the same wherever it is hosted)."""
        return f"{self.root}/{key}" if self.remote else os.path.join(self.root, key)

    def local_path(self, key: str, host_key: str) -> str | None:
        """The local folder of broker ``key`` hosted by node ``host_key``'s actor (None: a folder root holds all)."""
        if self.local_root is None:
            return None
        name = key if key == host_key else f"{key}.on-{host_key}"
        return str(Path(self.local_root) / name)

    def env(self) -> dict[str, str]:
        """What a broker's subprocess gets in its environment (the options; none for a folder root)."""
        return {OPTIONS_ENV: json.dumps(dict(self.options))} if self.remote and self.options else {}


def broker_storage(
    storage_root: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    local_root: str | os.PathLike[str] | None = None,
) -> BrokerStorage:
    """Check the cluster's storage once, in the driver: ``ConfigError`` as ``Queue(storage_path=...)`` gives.

    A URI takes ``storage_options`` (else ``PERSISTING_STORAGE_OPTIONS`` of the driver) and ``local_root`` (else
    ``PERSISTING_LOCAL_PATH``, else the default local folder of the URI, as a single broker's); a folder takes
    neither."""
    location = parse_location(storage_root, storage_options, local_root)
    if location.uri is None:
        return BrokerStorage(str(location.local))
    return BrokerStorage(location.uri, str(location.local), dict(location.options))
