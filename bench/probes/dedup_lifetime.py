"""What payload lifetime costs (docs/concepts/dedup.md "Lifetime"): ``python -m bench dedup-lifetime``.

Embedded mode, one process, durability="sync" (the default). Each step puts one GRPO step (``--prompts`` x
``--responses`` samples; each prompt's image, float32 3 x 64 x 64 = 48 KiB, repeated for its responses; token ids
int64 x 256 per sample; new images every step, as an RL run's steps) into the long-lived partition "train", then
clears the step's samples by index (as verl's ``kv_clear`` does). Timed per call: the put, and the clear. The same
steps go into a topic without dedup, in the same run, interleaved step by step: that is the reference (its puts
and clears carry no references, so they count none). Then ``--open-samples`` samples (4 per image) are put into a
fresh topic of each kind, closed, and opened again ``--open-repeats`` times (timed: the open, with its rebuild of
the references from Lance; median). Reported: medians over the steps, the median of ``--reps`` runs, and the
ratio deduped / reference. Run it on two checkouts (``PYTHONPATH=<checkout> python -m bench.probes.dedup_lifetime``,
or a copy of this file beside each checkout's ``persisting/``) to compare before and after. A probe, not a suite:
its own output, so that a copy of this one file runs beside any checkout.
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench dedup-lifetime", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="GRPO steps put and cleared per run (default 60)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--responses", type=int, default=8, help="responses per prompt (default 8)")
    p.add_argument("--open-samples", type=int, default=8192, help="samples in the topics reopened (default 8192)")
    p.add_argument("--open-repeats", type=int, default=5, help="timed opens per kind and run (default 5)")
    p.add_argument("--reps", type=int, default=3, help="runs, medians reported (default 3)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if min(args.steps, args.prompts, args.responses, args.open_samples, args.open_repeats, args.reps) < 1:
        raise SystemExit("every count must be at least 1")
    runs: list[dict[str, Any]] = []
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="dedup-lifetime-") as tmp:
            runs.append(one_run(Path(tmp), args))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    for what in ("put", "clear", "open"):
        d, p = med[f"{what}_dedup_ms"], med[f"{what}_plain_ms"]
        print(f"{what:5s}  dedup {d:8.3f} ms  reference (no dedup) {p:8.3f} ms  ratio {d / p:5.2f}x")
    return 0


try:  # beside a checkout without the harness (a copy of this file), the probe runs alone
    from bench.harness import Probe
except ImportError:
    pass
else:
    PROBE = Probe(
        "dedup-lifetime", "what payload lifetime costs: put, clear and open with dedup vs without", parser, main
    )


if __name__ == "__main__":
    raise SystemExit(main())
