"""One append to a Lance dataset through several encoders at once: the table is cut into row ranges, each range is
written as a fragment by its own worker thread (``lance.fragment.write_fragments``), and the fragments are committed
together in ONE ``LanceOperation.Append``, in row order, so positions are those a single ``write_dataset`` gives.

Why: Lance encodes one ``write_dataset`` stream on one core (pylance 14: ~2 s of CPU per GB of a fixed-shape
float32 tensor column, with or without ``lance-encoding:compression=none``, which stores the same bytes), so a
sustained tensor stream is bound by one core, not by the disk. Pieces below ``MIN_ENCODER_BYTES`` are not worth a
fragment of their own (each costs a file, a row in the manifest and, small, a rewrite by compaction): a small
flush stays one stream.

Crash safety: a fragment is invisible until the commit lands, so a kill between the writes and the commit leaves
only unreferenced files, which ``remove_orphans`` deletes at the next open (before any write); the commit itself is
atomic, and a commit that lands without its writer knowing is recognized by the engine's index column.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import lance
import pyarrow as pa
from lance.fragment import FragmentMetadata, write_fragments

from ..errors import ConfigError, StorageError

ENCODERS_ENV = "PERSISTING_LANCE_ENCODERS"
MAX_DEFAULT_ENCODERS = 8
# A piece of at least this much payload gets an encoder (a fragment) of its own: as big as a fragment compaction
# leaves alone (lance_compaction.COMPACT_BELOW_BYTES), so no payload is written twice. The kill -9 tests lower it.
MIN_ENCODER_BYTES = int(os.environ.get("PERSISTING_LANCE_MIN_ENCODER_BYTES", str(16 * 1024 * 1024)))

_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def default_encoders() -> int:
    """``PERSISTING_LANCE_ENCODERS`` if set, else the cores this process may run on, at most 8.

    Every core: a flush of arena batches runs at most a quarter of the time (the flush loop's duty factor) and its
    encoders sleep while the disk writes, so they rarely take the cores the hand-overs need; beyond 8 the disk, not
    the encoders, is the bound on the machines this was measured on.
    """
    env = os.environ.get(ENCODERS_ENV)
    if env:
        return check_encoders(env, ENCODERS_ENV)
    return max(1, min(MAX_DEFAULT_ENCODERS, len(os.sched_getaffinity(0))))


def check_encoders(value: Any, name: str = "encoders") -> int:
    """``value`` (an int, or its decimal string) as an encoder count >= 1, or ``ConfigError`` naming ``name``."""
    n = int(value) if isinstance(value, str) and value.strip().isdecimal() else value
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{name} must be an int >= 1 (Lance encoder threads per append), got {value!r}")
    return n


# A big append is cut into pieces of about this much payload even where fewer encoders run: pylance 14 spends
# 0.8 CPU s/GB encoding a fixed-shape float32 column in 8-16 MiB pieces against 1.4 at 32 MiB and 2.6 at 64 MiB
# (``python -m bench lance-encoding``, pieces table), and the fsync of one piece's file (on a syncing thread)
# overlaps the encoding of the next instead of following the whole append.
PIPELINE_BYTES = 16 * 1024 * 1024


def pieces(table: pa.Table, encoders: int) -> list[pa.Table]:
    """``table`` cut into row ranges of at least ``MIN_ENCODER_BYTES`` each (zero-copy): ``encoders`` of them,
    or more, about ``PIPELINE_BYTES`` each, where the table is larger than that per encoder."""
    n = max(encoders, table.nbytes // PIPELINE_BYTES)
    n = max(1, min(n, table.nbytes // MIN_ENCODER_BYTES, table.num_rows))
    if n == 1:
        return [table]
    step = -(-table.num_rows // n)
    return [table.slice(k, step) for k in range(0, table.num_rows, step)]


def _pool(encoders: int) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(encoders)
        if pool is None:
            pool = _pools[encoders] = ThreadPoolExecutor(encoders, thread_name_prefix="persisting-lance-encoder")
        return pool


def append(
    ds: lance.LanceDataset, table: pa.Table, encoders: int, storage_options: dict[str, str] | None
) -> lance.LanceDataset:
    """Append ``table`` to ``ds`` (one commit); the new version's dataset. Blocking: call it on a worker thread."""
    parts = pieces(table, encoders)
    if len(parts) == 1:
        return lance.write_dataset(table, ds, mode="append")
    pool = _pool(encoders)
    data = _local_data_dir(ds, storage_options)
    futures: list[Future[tuple[list[FragmentMetadata], Future[None] | None]]] = [
        pool.submit(_write_and_sync, part, ds, storage_options, data) for part in parts
    ]
    # Every write is waited for, failed or not: none may still be writing once the caller gives up on this append.
    errors = [f.exception() for f in futures]
    syncs = [f.result()[1] for f, e in zip(futures, errors, strict=True) if e is None]
    errors += [s.exception() for s in syncs if s is not None]
    for error in errors:
        if error is not None:
            raise error
    fragments = [fragment for f in futures for fragment in f.result()[0]]
    return lance.LanceDataset.commit(
        ds, lance.LanceOperation.Append(fragments), read_version=ds.version, storage_options=storage_options
    )


def create(
    table: pa.Table, uri: str, encoders: int, storage_options: dict[str, str] | None, session: Any
) -> lance.LanceDataset:
    """Create a dataset holding ``table``: its first piece in the create, the others appended through ``append``
    (Lance's one-stream ``write_dataset`` buffers about twice a table in memory: 1 GB more for a 512 MiB
    tensor column, against 0.15 GB in 64 MiB pieces). Two commits: a crash between them leaves a prefix of the
    rows, which the engine's replay completes (it skips rows the bucket's index column already holds)."""
    parts = pieces(table, encoders)
    ds = lance.write_dataset(
        parts[0],
        uri,
        mode="create",
        enable_stable_row_ids=True,
        session=session,
        storage_options=storage_options,
    )
    rest = table.slice(parts[0].num_rows)
    return append(ds, rest, encoders, storage_options) if rest.num_rows else ds


def _local_data_dir(ds: lance.LanceDataset, storage_options: dict[str, str] | None) -> str | None:
    """The folder of ``ds``'s data files on local disk, or None (an object store: nothing to fsync)."""
    uri = str(ds.uri)
    if storage_options or ("://" in uri and not uri.startswith("file://")):
        return None
    return os.path.join(uri.removeprefix("file://"), "data")


def _write_and_sync(
    part: pa.Table, ds: lance.LanceDataset, storage_options: dict[str, str] | None, data: str | None
) -> tuple[list[FragmentMetadata], Future[None] | None]:
    """One piece's fragments, and the fsync of their files started on a syncing thread, so that it overlaps the
    encoding of the next piece (the caller's ``FileSync`` still syncs every new file after the commit: by then
    they are clean, so it is quick, and it stays the one guarantee)."""
    fragments = write_fragments(part, ds, storage_options=storage_options)
    if data is None:
        return fragments, None
    paths = [os.path.join(data, f.path) for frag in fragments for f in frag.files]
    return fragments, _SYNCER.submit(_fsync_all, paths)


def _fsync_all(paths: list[str]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_SYNCER = ThreadPoolExecutor(2, thread_name_prefix="persisting-lance-sync")


def remove_orphans(ds: lance.LanceDataset, retain_seconds: float, guard: Callable[[], None]) -> None:
    """Delete the files no version refers to (fragments written by an append whose commit never came) and the
    versions superseded more than ``retain_seconds`` ago. Only at open, and only by the engine that may write
    (``guard`` raises otherwise, on an object store): nothing else may be writing this dataset."""
    try:
        guard()
    except StorageError:
        return
    try:
        ds.cleanup_old_versions(older_than=timedelta(seconds=retain_seconds), delete_unverified=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise StorageError(f"removing unreferenced files of {ds.uri} failed: {exc}") from exc
