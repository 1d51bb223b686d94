"""``save_checkpoint`` / ``load_checkpoint`` with TransferQueue 0.1.11's directory contract.

A checkpoint is a directory written as ``<dir>.tmp`` and renamed into place (the previous one moved to
``<dir>.old`` first and removed after), holding ``metadata.json`` = ``{"storage_saved": bool, "user_metadata":
{...}}`` as TransferQueue writes it, plus persisting's own state: an embedded persisting store (a data topic
with its keys, the same layout as the live one) under ``persisting/``, holding every key of every partition with
its fields and tags. ``load_checkpoint`` replaces the live keys by the checkpoint's (keys made since are
cleared), and rolls back an interrupted save (``<dir>.old`` left without ``<dir>``) as TransferQueue does.

persisting does not need a checkpoint to survive a crash (every acknowledged write is in the broker's log);
verl's resume path uses one to go back to the state of a training step, which this gives.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from persisting import Queue

from .. import _engine
from .store import KVStore

logger = logging.getLogger(__name__)
METADATA_FILE = "metadata.json"
STATE_DIR = "persisting"
COPY_CHUNK = 1024  # keys per get/put while copying


def _embedded(root: Path, dedup: Any) -> KVStore:
    """The checkpoint's store, deduped as the live one (``persisting.dedup``): a step's images stored once."""
    data = Queue(
        "transfer_queue", storage_path=str(root), num_buckets=1, durability="process", objects="pickle", dedup=dedup
    )
    return KVStore(data, dedup)


async def _copy(src: KVStore, dst: KVStore) -> int:
    """Every key of ``src`` (fields and tags) into ``dst``; returns how many. Keys with different field sets are
    copied in groups, each with its own fields."""
    listed = await src.kv_list(None)
    copied = 0
    for partition, tags in listed.items():
        keys = list(tags)
        if not keys:
            continue
        described, found = await src.lookup(keys, partition)
        groups: dict[tuple[str, ...], list[int]] = {}
        for n, s in enumerate(described.samples):
            names = tuple(f for f, m in s.fields.items() if m.is_ready)
            groups.setdefault(names, []).append(n)
        indexes = described.global_indexes
        for names, positions in groups.items():
            for at in range(0, len(positions), COPY_CHUNK):
                part = positions[at : at + COPY_CHUNK]
                chunk = [found[n] for n in part]
                fields = await src.get_data(partition, [indexes[n] for n in part], list(names)) if names else None
                await dst.kv_batch_put(chunk, partition, fields, [tags[k] for k in chunk])
                copied += len(chunk)
    return copied


async def _clear_all(store: KVStore) -> None:
    for partition, keys in (await store.kv_list(None)).items():
        await store.kv_clear(list(keys), partition)


async def _save(live: KVStore, root: Path) -> int:
    ckpt = _embedded(root, live.dedup)
    try:
        return await _copy(live, ckpt)
    finally:
        await ckpt.aclose()


async def _load(live: KVStore, root: Path) -> int:
    ckpt = _embedded(root, live.dedup)
    try:
        await _clear_all(live)
        return await _copy(ckpt, live)
    finally:
        await ckpt.aclose()


def _one_node(live: object) -> None:
    # On several nodes the store routes each call to a partition's owner; a checkpoint would have to gather every
    # node's keys into one folder and scatter them back, which is not built (their keys are durable there anyway).
    if not isinstance(live, KVStore):
        raise NotImplementedError(
            "save_checkpoint/load_checkpoint are not covered on several nodes: every acknowledged key is on disk "
            "with its owner node already (a restarted process finds it); use persisting.backend=broker on one node"
        )


def save_checkpoint(
    live: KVStore, checkpoint_dir: str | Path, include_storage: bool = True, metadata: dict[str, Any] | None = None
) -> None:
    _one_node(live)
    checkpoint_dir = Path(checkpoint_dir)
    tmp = checkpoint_dir.parent / f"{checkpoint_dir.name}.tmp"
    old = checkpoint_dir.parent / f"{checkpoint_dir.name}.old"
    if not include_storage:
        logger.warning("include_storage=False: persisting saves the data too (a checkpoint must restore it)")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        n = _engine.run(_save(live, tmp / STATE_DIR))
        (tmp / METADATA_FILE).write_text(
            json.dumps({"storage_saved": True, "user_metadata": metadata or {}}, indent=2, default=str)
        )
        if checkpoint_dir.exists():
            if old.exists():
                shutil.rmtree(old)
            checkpoint_dir.rename(old)
        tmp.rename(checkpoint_dir)
        if old.exists():
            shutil.rmtree(old)
        logger.info("Checkpoint of %d keys saved to %s", n, checkpoint_dir)
    except BaseException:
        if tmp.exists():
            shutil.rmtree(tmp)
        if old.exists() and not checkpoint_dir.exists():
            old.rename(checkpoint_dir)
        raise


def load_checkpoint(live: KVStore, checkpoint_dir: str | Path) -> None:
    _one_node(live)
    checkpoint_dir = Path(checkpoint_dir)
    old = checkpoint_dir.parent / f"{checkpoint_dir.name}.old"
    if not checkpoint_dir.exists() and old.exists():
        logger.warning("Found interrupted checkpoint replacement; restoring %s to %s", old, checkpoint_dir)
        old.rename(checkpoint_dir)
    if not checkpoint_dir.exists():
        raise FileNotFoundError(f"Checkpoint directory not found: {checkpoint_dir}")
    if not (checkpoint_dir / METADATA_FILE).exists():
        raise FileNotFoundError(f"{METADATA_FILE} not found in {checkpoint_dir}")
    json.loads((checkpoint_dir / METADATA_FILE).read_text())
    if not (checkpoint_dir / STATE_DIR).exists():
        raise FileNotFoundError(
            f"{STATE_DIR}/ not found in {checkpoint_dir}: not a checkpoint written by persisting's TransferQueue "
            "layer (TransferQueue's own checkpoints hold pickled controller state, which persisting never loads)"
        )
    n = _engine.run(_load(live, checkpoint_dir / STATE_DIR))
    logger.info("Checkpoint of %d keys loaded from %s", n, checkpoint_dir)
