"""A process killed (SIGKILL, by itself) at one moment of a deduped put or clear, for test_payload_lifetime.

Usage: python payload_crash_worker.py STORAGE MODE, embedded topic "crash", partition "p". It puts batch A (kept)
and batch B, prints DONE after each acknowledged step, then, by MODE:
  samples: puts batch C and dies after C's new payload rows are stored, before C's samples are;
  clear:   clears B's samples; the log write of that clear (the samples' record, then their payload rows') lands
           with its first record only, and the process dies (a torn write: what a power loss may leave).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import numpy as np

from persisting import SyncQueue
from persisting.client.tensor_puts import TensorPuts
from persisting.engine.consumption import ConsumptionLog
from persisting.tensors import dedup


def batch(images: list[int]) -> dict[str, np.ndarray]:
    pix = np.stack([np.random.default_rng(i).random((3, 32, 32), dtype=np.float32) for i in images])
    return {"pixel_values": np.repeat(pix, 2, axis=0), "tok": np.arange(2 * len(images), dtype=np.int64)}


def die(*_args: Any, **_kw: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    storage, mode = sys.argv[1:3]
    with SyncQueue("crash", storage, dedup=["pixel_values"], num_buckets=1) as q:
        q.put(batch([1, 2]), partition_id="p")
        b = q.put(batch([3, 4]), partition_id="p")
        print("DONE puts", flush=True)
        if mode == "samples":
            store = TensorPuts._store

            async def store_then_die(
                self: TensorPuts, topic: Any, columns: Any, other: Any, n: int, where: str, *a: Any, **kw: Any
            ) -> Any:
                if not where.startswith(dedup.PAYLOAD_PARTITION_PREFIX):
                    die()
                return await store(self, topic, columns, other, n, where, *a, **kw)

            TensorPuts._store = store_then_die  # type: ignore[method-assign]
            q.put(batch([5, 6]), partition_id="p")
        else:
            append = ConsumptionLog.append

            def first_then_die(self: ConsumptionLog, *records: list[Any], sync: bool = False) -> None:
                if len(records) > 1:
                    append(self, records[0], sync=True)
                    die()
                append(self, *records, sync=sync)

            ConsumptionLog.append = first_then_die  # type: ignore[method-assign]
            q.clear(b, partition_id="p")


if __name__ == "__main__":
    main()
