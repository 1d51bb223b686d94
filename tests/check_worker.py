"""A producer that dies mid-flight, for tests/test_check.py: it leaves what a kill -9 leaves, rows only in the log
and a batch only in its spool file, then exits without closing anything.

Usage: python check_worker.py STORAGE_PATH
Topics: "torn" (flushed records, then records only in the log), "nospool" (flushed records, then a tensor batch
above the spool limit, acknowledged from its spool file: the worker exits before its flush can delete the file).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from persisting import SyncQueue
from persisting.tensors import pieces

SPOOL_ABOVE_BYTES = 1 << 20  # batches above 1 MiB go through a spool file (embedded mode)


def main() -> None:
    path = sys.argv[1]
    pieces.SPOOL_ABOVE_BYTES = SPOOL_ABOVE_BYTES
    queues = []
    for name in ("torn", "nospool"):
        q = SyncQueue(name, storage_path=path, num_buckets=1, batch_size=10**6, auto_flush_interval_sec=3600.0)
        q.put_batch([{"id": i, "pad": "x" * i} for i in range(5)])
        q.flush()
        queues.append(q)
    queues[0].put_batch([{"id": i, "pad": "y" * i} for i in range(5, 8)])  # in the log only
    batch = np.arange(4 * SPOOL_ABOVE_BYTES // 4, dtype=np.float32).reshape(4, -1)
    queues[1].put({"x": batch}, partition_id="p")  # acknowledged from its spool file; its flush starts now
    os._exit(0)  # before that flush can land: what a kill -9 leaves


if __name__ == "__main__":
    main()
