"""Client processes for tests/test_segments.py: a producer of big batches and a consumer that holds views of them.

Run as ``python -m tests.segment_worker ROLE ADDRESS ARGS...`` (stdout is line-buffered for the test to read):

produce ADDRESS SAMPLES COUNT SEED [reserve]
    puts COUNT batches of SAMPLES samples (``batch(seed + k, SAMPLES)``, fields x, k, j) to topic ``seg``,
    partition ``p``; prints ``WRITING k`` before the k-th put (its bytes are made already: the put is the lease,
    the copy into shared memory and the request) and ``ACK s first`` once the batch of seed s is acknowledged.
    With ``reserve``: then reserves one more batch of SAMPLES samples, fills half of it, prints
    ``RESERVED <in_arena>`` and hangs (to be SIGKILLed holding a lease it is writing into).
hold ADDRESS N
    takes N samples of ``seg``/``p`` (task ``hold``) with get_meta and get_data, checks every byte against
    ``batch``, prints ``HOLDING <json>`` ({n, equal, files: the shared-memory files its views are mappings of,
    zero_copy: get_zero_copy_bytes of its stats}) and keeps the views until a line ``release`` on stdin: then
    drops them, makes a request (which carries the release to the broker), prints ``RELEASED`` and waits for EOF.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from persisting import SyncQueue

SAMPLE_BYTES = 1024 * 1024  # one sample of a big batch: 1 MiB of uint8
TOPIC = "seg"


def batch(seed: int, samples: int) -> np.ndarray:
    """Seeded random bytes, one row per sample (cheap to remake, so a reader checks every byte)."""
    return np.frombuffer(np.random.default_rng(seed).bytes(samples * SAMPLE_BYTES), np.uint8).reshape(samples, -1)


def columns(seed: int, samples: int) -> dict[str, Any]:
    """A put's fields: the tensor ``x``, and per sample the batch's seed ``k`` and its row in the batch ``j``."""
    return {"x": batch(seed, samples), "k": [seed] * samples, "j": list(range(samples))}


def check(data: Any) -> bool:
    """Whether every row of ``data["x"]`` is the ``j``-th row of ``batch(k)`` (k, j: the row's own fields; a
    shorter batch of a seed is a prefix of a longer one)."""
    need: dict[int, int] = {}
    for k, j in zip(data["k"], data["j"], strict=True):
        need[k] = max(need.get(k, 0), j + 1)
    made = {k: batch(k, n) for k, n in need.items()}
    x = data["x"]
    return all(
        np.array_equal(np.asarray(x[row]), made[k][j])
        for row, (k, j) in enumerate(zip(data["k"], data["j"], strict=True))
    )


def mappings() -> list[tuple[int, int, str]]:
    """This process's mappings: (start, end, file; "" for anonymous memory), an unlinked file by its name."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(v, 16) for v in parts[0].split("-"))
        out.append((lo, hi, parts[5].removesuffix(" (deleted)") if len(parts) == 6 else ""))
    return out


def mapped_files(arrays: list[np.ndarray]) -> list[str]:
    """The files of this process's mappings in which the arrays' data lie (sorted, distinct; "" for none)."""
    spans = mappings()
    out = set()
    for a in arrays:
        address = a.__array_interface__["data"][0]
        out.add(next((name for lo, hi, name in spans if lo <= address < hi), ""))
    return sorted(out)


def produce(address: str, samples: int, count: int, seed: int, reserve: bool) -> None:
    with SyncQueue(TOPIC, broker=address) as q:
        for k in range(count):
            data = columns(seed + k, samples)
            print(f"WRITING {k}", flush=True)
            meta = q.put(data, partition_id="p", timeout=20)
            print(f"ACK {seed + k} {meta.global_indexes[0]}", flush=True)
        if reserve:
            r = q.reserve({"x": ((SAMPLE_BYTES,), np.uint8)}, batch_size=samples, partition_id="p", timeout=20)
            r["x"][: samples // 2] = 0xAB  # killed mid-write: half of it written
            print(f"RESERVED {r.in_arena}", flush=True)
            time.sleep(3600)
    print("DONE", flush=True)


def hold(address: str, n: int) -> None:
    with SyncQueue(TOPIC, broker=address) as q:
        meta = q.get_meta(["x", "k", "j"], n, "hold", "p")
        data = q.get_data(meta)
        views = [np.asarray(data["x"])]
        report = {
            "n": meta.size,
            "equal": check(data),
            "files": mapped_files(views),
            "zero_copy": q.stats()["zerocopy"]["get_zero_copy_bytes"],
        }
        print(f"HOLDING {json.dumps(report)}", flush=True)
        for line in sys.stdin:
            if line.strip() == "release":
                del data, views
                gc.collect()
                q.get_meta(["x"], 0, "other", "p")  # a request: it carries the pending release
                print("RELEASED", flush=True)
        # stdin closed: exit (closing the queue sends whatever is left)


def main() -> None:
    role, address, *args = sys.argv[1:]
    if role == "produce":
        produce(address, int(args[0]), int(args[1]), int(args[2]), args[3:] == ["reserve"])
    elif role == "hold":
        hold(address, int(args[0]))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
