"""Producer of batches larger than the arena, for the kill -9 tests of test_big_batches.py.

argv: storage path, broker address ("-" for embedded), samples per batch, batches, first seed. Prints
``ACK s first`` once the batch made from seed s (``big_batch``) is acknowledged, ``WRITING k`` before the k-th
put (so a test can aim its kill), and ``DONE`` at the end; an exception ends it with ``ERROR ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from persisting import SyncQueue
from persisting.tensors import pieces
from tests.test_big_batches import ARENA_BYTES, big_batch


def main() -> None:
    storage, address, samples, count, seed = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    pieces.SPOOL_ABOVE_BYTES = ARENA_BYTES  # embedded: the same limit as the tests' arena
    broker = None if address == "-" else address
    try:
        with SyncQueue("big", storage_path=storage, broker=broker) as q:
            for k in range(count):
                data = big_batch(seed + k, samples)
                print(f"WRITING {k}", flush=True)
                meta = q.put({"pixels": data, "k": [seed + k] * samples}, partition_id="p")
                print(f"ACK {seed + k} {meta.global_indexes[0]}", flush=True)
        print("DONE", flush=True)
    except Exception as exc:  # the broker was killed under us: what was acknowledged is what counts
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
