"""Worker processes of tests/test_compat_persistqueue_processes.py (started with spawn)."""

from __future__ import annotations

import sys
import time

import persisting.compat.persistqueue as persistqueue
from persisting.errors import Empty

GET_TIMEOUT_S = 0.5


def produce(path: str, broker: str, first: int, count: int) -> None:
    q = persistqueue.SQLiteAckQueue(path, broker=broker, durability="process")
    for n in range(first, first + count):
        q.put({"n": n})
    q.close()


def consume(path: str, broker: str, log_path: str, idle_s: float, hold_after: int | None) -> None:
    """Get and ack until the queue stays empty ``idle_s``; write each acked n to ``log_path`` (after the ack).
    ``hold_after``: after that many acks, get one more item and then sleep without acking (to be killed)."""
    q = persistqueue.SQLiteAckQueue(path, broker=broker, durability="process")
    acked = 0
    idle_since = time.monotonic()
    with open(log_path, "a", buffering=1) as log:
        while time.monotonic() - idle_since < idle_s:
            try:
                item = q.get(timeout=GET_TIMEOUT_S)
            except Empty:
                continue
            idle_since = time.monotonic()
            if hold_after is not None and acked >= hold_after:
                log.write("holding\n")
                time.sleep(3600)
            q.ack(item)
            log.write(f"{item['n']}\n")
            acked += 1
    q.close()


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        hold = None if sys.argv[6] == "-" else int(sys.argv[6])
        consume(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), hold)
