"""What payload lifetime costs (docs/concepts/dedup.md "Lifetime"): ``python -m bench.dedup_lifetime``.

Embedded mode, one process, durability="sync" (the default). Each step puts one GRPO step (``--prompts`` x
``--responses`` samples; each prompt's image, float32 3 x 64 x 64 = 48 KiB, repeated for its responses; token ids
int64 x 256 per sample; new images every step, as an RL run's steps) into the long-lived partition "train", then
clears the step's samples by index (as verl's ``kv_clear`` does). Timed per call: the put, and the clear. The same
steps go into a topic without dedup, in the same run, interleaved step by step: that is the reference (its puts
and clears carry no references, so they count none). Then ``--open-samples`` samples (4 per image) are put into a
fresh topic of each kind, closed, and opened again ``--open-repeats`` times (timed: the open, with its rebuild of
the references from Lance; median). Reported: medians over the steps, the median of ``--runs`` runs, and the
ratio deduped / reference. Run it on two checkouts (``PYTHONPATH=<checkout> python -m bench.dedup_lifetime``, or
a copy of this file beside each checkout's ``persisting/``) to compare before and after.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from persisting import SyncQueue


def step(prompts: int, responses: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.random((prompts, 3, 64, 64), dtype=np.float32)
    return {
        "pixel_values": np.repeat(images, responses, axis=0),
        "input_ids": rng.integers(0, 50_000, (prompts * responses, 256), dtype=np.int64),
    }


def one_run(root: Path, args: argparse.Namespace) -> dict[str, float]:
    put: dict[str, list[float]] = {"dedup": [], "plain": []}
    clear: dict[str, list[float]] = {"dedup": [], "plain": []}
    queues = {
        "dedup": SyncQueue("lifetime-dedup", str(root), dedup=["pixel_values"], num_buckets=1),
        "plain": SyncQueue("lifetime-plain", str(root), num_buckets=1),
    }
    try:
        for s in range(args.steps):
            data = step(args.prompts, args.responses, s)
            for kind, q in queues.items():
                t0 = time.perf_counter()
                meta = q.put(data, partition_id="train")
                t1 = time.perf_counter()
                q.clear(meta, partition_id="train")
                t2 = time.perf_counter()
                put[kind].append(t1 - t0)
                clear[kind].append(t2 - t1)
    finally:
        for q in queues.values():
            q.close()
    out = {
        f"{what}_{kind}_ms": 1e3 * statistics.median(v)
        for what, d in (("put", put), ("clear", clear))
        for kind, v in d.items()
    }
    kinds: dict[str, dict[str, Any]] = {"dedup": {"dedup": ["pixel_values"]}, "plain": {}}
    for kind, kw in kinds.items():
        with SyncQueue(f"open-{kind}", str(root), num_buckets=1, **kw) as q:
            for s in range(0, args.open_samples, 256):
                q.put(step(64, 4, 10_000 + s), partition_id="train")
    opens: dict[str, list[float]] = {"dedup": [], "plain": []}
    for _ in range(args.open_repeats):  # interleaved, so that the machine's drift hits both alike
        for kind, kw in kinds.items():
            t0 = time.perf_counter()
            with SyncQueue(f"open-{kind}", str(root), num_buckets=1, **kw) as q:
                opens[kind].append(time.perf_counter() - t0)
                q.partitions()
    out.update({f"open_{kind}_ms": 1e3 * statistics.median(v) for kind, v in opens.items()})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--responses", type=int, default=8)
    parser.add_argument("--open-samples", type=int, default=8192)
    parser.add_argument("--open-repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="dedup-lifetime-") as tmp:
            runs.append(one_run(Path(tmp), args))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    for what in ("put", "clear", "open"):
        d, p = med[f"{what}_dedup_ms"], med[f"{what}_plain_ms"]
        print(f"{what:5s}  dedup {d:8.3f} ms  reference (no dedup) {p:8.3f} ms  ratio {d / p:5.2f}x")


if __name__ == "__main__":
    main()
