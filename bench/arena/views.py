"""What a consumer's copy-on-write views cost, in one process, without the pipeline around them.

Since consumer isolation (docs/concepts/consumer-isolation.md) each ``get_data`` maps its extents once more,
``MAP_PRIVATE`` (``Arena.private``), instead of slicing the process's one shared, pre-faulted mapping. Three ways
to receive a batch already in an arena file, interleaved batch by batch so that the machine's noise hits each
alike (GB/s over the batch bytes):

- ``shared view + read``: a slice of a ``MAP_SHARED | MAP_POPULATE`` mapping made once (the consumer before),
  every byte read;
- ``private view + read``: ``Arena.private`` per batch, every byte read, then dropped (unmapped);
- ``private view``: ``Arena.private`` per batch and dropped, one element read: the hand-over alone.
"""

from __future__ import annotations

import time
import uuid

import numpy as np

from bench.arena.batches import POOL, Shape, make_pool, read_all
from bench.arena.pair import Row
from persisting.tensors.arena import HEADER_BYTES, SHM_DIR, Arena, align_up


def run_view_cost(shape: Shape, batches: int, seed: int) -> list[Row]:
    pool = make_pool(shape, seed)
    size = align_up(shape.batch_bytes, 4096)
    path = SHM_DIR / f"persisting-bench-{uuid.uuid4().hex[:12]}.arena"
    owner = Arena.create(path, HEADER_BYTES + POOL * size)
    try:
        shared = Arena.attach(path, expect_generation=owner.generation)
        for i, batch in enumerate(pool):
            at = HEADER_BYTES + i * size
            flat = np.concatenate([v.reshape(-1).view(np.uint8) for v in batch.values()])
            shared.view(at, flat.nbytes, writable=True)[:] = flat
        ways = {
            "shared view + read": lambda at: read_all({"b": shared.view(at, shape.batch_bytes)}),
            "private view + read": lambda at: read_all({"b": owner.private(at, shape.batch_bytes)}),
            "private view": lambda at: int(owner.private(at, shape.batch_bytes)[0]),
        }
        for way in ways.values():  # warm: every page of the file touched once
            way(HEADER_BYTES)
        seconds = dict.fromkeys(ways, 0.0)
        for i in range(batches):
            at = HEADER_BYTES + (i % POOL) * size
            for name, way in ways.items():
                t0 = time.perf_counter()
                way(at)
                seconds[name] += time.perf_counter() - t0
        shared.close()
    finally:
        owner.close()
    return [
        Row.of(
            f"view-{name.replace(' + ', '-').replace(' ', '-')}-{shape.key}",
            f"consumer {name}",
            "view",
            shape,
            batches,
            "one process, batches already in an arena file; " + name,
            received=batches,
            seconds=secs,
        )
        for name, secs in seconds.items()
    ]
