"""A process that kills itself (SIGKILL) between two commits of a column rewrite (lance_columns.rewrite_column).

Usage: python rewrite_kill_worker.py PATH STAGE
It stores ``RECORDS`` and ``FIRST`` and flushes, then stores ``SECOND`` (a sample of another shape: its flush moves
the field ``x`` to the variable-shape layout by a rewrite) and prints ACK once it is acknowledged; that flush dies
just before the rewrite's drop (STAGE "drop": the new column was only added) or its rename (STAGE "rename": the
old column was dropped too). Every batch carries user keys ending in ``#rewrite`` (the old temporary name).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import lance
import numpy as np

from persisting import Queue

TOPIC = "rw"
RECORDS: list[dict[str, Any]] = [
    {"id": 0, "score": 1.0, "score#rewrite": "keep me"},
    {"id": 1, "note#rewrite": "hello"},
]
FIRST = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "x#rewrite": ["keep", "me"]}
SECOND = {"x": np.full((1, 4), 7, dtype=np.float32), "x#rewrite": ["too"]}
STAGES = {"drop": "drop_columns", "rename": "alter_columns"}


def expected() -> list[dict[str, Any]]:
    """What a read of the whole topic gives back, in order."""
    samples = [{"x": FIRST["x"][i], "x#rewrite": FIRST["x#rewrite"][i]} for i in range(2)]
    return [dict(r) for r in RECORDS] + samples + [{"x": SECOND["x"][0], "x#rewrite": "too"}]


async def main(path: str, stage: str) -> None:
    async with Queue(TOPIC, storage_path=path, num_buckets=1) as q:
        await q.put_batch(RECORDS)
        await q.put(FIRST, partition_id="p")
        await q.flush()

        def die(*args: Any, **kwargs: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        setattr(lance.LanceDataset, STAGES[stage], die)  # the next call of it is the rewrite's
        await q.put(SECOND, partition_id="p")
        print("ACK", flush=True)
        await q.flush()
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
