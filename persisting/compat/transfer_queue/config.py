"""The TransferQueue layer's configuration: its ``persisting`` section of TransferQueue's ``conf``, and the store
it opens with it. A leaf of the layer: both planes (``node_broker.py``, ``ray_plane.py``) read it.

Configuration (``conf`` is TransferQueue's config; persisting reads only its optional ``persisting`` section)::

    persisting.storage_path   where the data lives (default $PERSISTING_STORAGE_PATH, else
                              $XDG_STATE_HOME/persisting/transfer_queue): a restarted run finds its keys there
    persisting.socket         the broker's ZeroMQ address (default ipc://<runtime folder>/tq-broker.sock)
    persisting.arena_bytes    the broker's shared-memory arena (default 1 GiB)
    persisting.topic          the topic name (default "transfer_queue")
    persisting.fresh          true: clear every partition at init (a new run on old storage)
    persisting.metrics        the broker's Prometheus endpoint, "HOST:PORT" (default off)
    persisting.objects        "pickle" (default: NonTensorStack entries pickled in the clients) or "codec"
    persisting.durability     "process" (default: survives kill -9 of any process) or "sync" (power loss too)
    persisting.backend        "auto" (default), "ray" or "broker": on several nodes, ``ray_plane.py``
    persisting.dedup          "auto" (default, or $PERSISTING_TQ_DEDUP), true, false or field names: ``dedup_mode``
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from persisting import Queue
from persisting.tensors import dedup

from .store import KVStore

DEFAULT_ARENA_BYTES = 1 << 30


def read_section(conf: Any) -> dict[str, Any]:
    if conf is None:
        return {}
    try:
        section = conf.get("persisting", None) if hasattr(conf, "get") else None
    except Exception:  # an OmegaConf struct config without the key
        section = None
    if section is None:
        return {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(section):
            return dict(OmegaConf.to_container(section, resolve=True))  # type: ignore[arg-type]
    except ImportError:
        pass
    return dict(section)


def storage_path(section: dict[str, Any]) -> str:
    storage = section.get("storage_path") or os.environ.get("PERSISTING_STORAGE_PATH")
    if not storage:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        storage = str(Path(state) / "persisting" / "transfer_queue")
    return str(storage)


def dedup_mode(section: dict[str, Any]) -> Any:
    """``persisting.dedup``: which fields a put stores once per distinct value (docs/guides/verl.md).

    "auto" (the default): each field decided at its first put into the topic, kept after (``tensors/dedup.py``):
    NonTensorStack columns whose pickles are >= 4 KiB per sample (``multi_modal_inputs``: a GRPO group's n
    responses carry the prompt's one ``pixel_values``), tensor columns whose samples are >= 4 KiB and repeat in
    that put (a prompt's image or tokens repeated per response). A text-only run's token, mask and log prob
    columns are distinct per response and stay plain (hashed once, at their first put), as do its small
    non-tensor columns. true: every NonTensorStack column and dense column >= 4 KiB per sample; false:
    none; a list: those fields (whatever their size)."""
    value = section.get("dedup")
    if value is None:  # $PERSISTING_TQ_DEDUP: true, false, auto or field names separated by commas
        env = os.environ.get("PERSISTING_TQ_DEDUP", dedup.AUTO)
        value = env.lower() if env.lower() in ("true", "false", dedup.AUTO) else [f for f in env.split(",") if f]
    if isinstance(value, str) and value.lower() in ("true", "false", dedup.AUTO):  # from an environment or a CLI
        value = dedup.AUTO if value.lower() == dedup.AUTO else value.lower() == "true"
    return dedup.check_mode(value)


def open_store(address: str, section: dict[str, Any]) -> KVStore:
    """The layer's store over the broker at ``address``: the data topic (its keys are the engine's index)."""
    topic = str(section.get("topic") or "transfer_queue")
    # "process" durability: a put is acknowledged once written to the broker's log (survives kill -9 of any
    # process, not a power loss); TransferQueue keeps everything in RAM, so this is already far more.
    durability = str(section.get("durability") or "process")
    # Python objects (NonTensorStack entries) are pickled and unpickled in the clients, never in the broker
    # (TransferQueue pickles everything); "codec" stores only what the record codec types exactly.
    objects = None if section.get("objects") == "codec" else "pickle"
    mode = dedup_mode(section)
    data = Queue(topic, broker=address, durability=durability, num_buckets=1, objects=objects, dedup=mode)
    return KVStore(data, mode)
