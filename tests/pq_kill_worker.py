"""Worker of tests/test_pq_sync_kills.py: random puts, gets, acks and nacks on an embedded persist-queue queue at
``durability="sync"`` until SIGKILLed, logging each call after it returned (``python -m tests.pq_kill_worker``)."""

from __future__ import annotations

import random
import sys

import persisting.compat.persistqueue as persistqueue
from persisting.errors import Empty


def run(cls: str, path: str, log_path: str, seed: int, first: int) -> None:
    q = getattr(persistqueue, cls)(path)
    ack = hasattr(q, "ack")
    rng = random.Random(seed)
    n = first
    with open(log_path, "a", buffering=1) as log:
        log.write("ready\n")
        while True:
            if rng.random() < 0.5:
                q.put(n)
                log.write(f"put {n}\n")
                n += 1
                continue
            try:
                got = q.get(block=False, raw=True)
            except Empty:
                continue
            log.write(f"got {got['data']}\n")
            if ack and rng.random() < 0.8:
                q.ack(id=got["pqid"])
                log.write(f"acked {got['data']}\n")
            elif ack:
                q.nack(id=got["pqid"])
                log.write(f"nacked {got['data']}\n")


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
