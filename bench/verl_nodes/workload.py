"""``python -m bench verl-nodes``: one verl-sized step through the TransferQueue layer on two Ray nodes.

A local Ray cluster of two raylets on this machine (``ray.cluster_utils.Cluster``: the head is node A, where the
driver runs and owns every partition, and node B), each with its own broker (``persisting.ray``). A worker actor
``kv_batch_put``s one step's trajectories (``verl_bench._trajectories``: jagged prompts, responses, ids, masks
and scores, a NonTensorStack of dicts, verl's tags) into a partition A owns, then ``kv_batch_get``s all of it
back; ``kv_clear`` ends the step. The reference, in the same run and cluster: the same worker pinned to A
(its own node's broker over ipc). Each run times ``--steps`` steps after one warm-up per worker and takes the
median; the table gives the median of ``--repeat`` runs, the two workers alternating.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from .verl_bench import _trajectories


class StepWorker:
    """A rollout worker timing its own calls (a Ray actor pinned to one node)."""

    def __init__(self) -> None:
        import persisting.compat.transfer_queue as tq

        tq.init()
        self.tq = tq

    def step(self, partition: str, keys: list[str], fields: Any, tags: list[Any]) -> tuple[float, float]:
        t0 = time.perf_counter()
        self.tq.kv_batch_put(keys=keys, partition_id=partition, fields=fields, tags=tags)
        t1 = time.perf_counter()
        got = self.tq.kv_batch_get(keys=keys, partition_id=partition)
        t2 = time.perf_counter()
        if got.batch_size[0] != len(keys) or not sorted(got.keys()) == sorted(fields.keys()):
            raise RuntimeError(f"read back {got.batch_size} with {sorted(got.keys())}")
        return t1 - t0, t2 - t1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench verl-nodes", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (default 16)")
    p.add_argument("--n", type=int, default=4, help="responses per prompt (default 4)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per run, after one warm-up (default 5)")
    p.add_argument("--repeat", type=int, default=3, help="runs; the median is reported (default 3)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import ray
    from ray.cluster_utils import Cluster

    import persisting.compat.transfer_queue as tq

    store_bytes = 512 * 1024 * 1024
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": store_bytes, "resources": {"node_a": 10}},
    )
    cluster.add_node(num_cpus=2, object_store_memory=store_bytes, resources={"node_b": 10})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    results: dict[str, list[tuple[float, float]]] = {"one node": [], "two nodes": []}
    with tempfile.TemporaryDirectory(prefix="verl-nodes-") as root:
        try:
            tq.init({"persisting": {"storage_path": root, "arena_bytes": 512 << 20}})
            actor: Any = ray.remote(num_cpus=0)(StepWorker)
            workers: dict[str, Any] = {
                "one node": actor.options(resources={"node_a": 1}).remote(),
                "two nodes": actor.options(resources={"node_b": 1}).remote(),
            }
            step = 0
            for run in range(args.repeat + 1):  # run 0: one warm-up step per worker
                for label, worker in workers.items():
                    times = []
                    for _ in range(1 if run == 0 else args.steps):
                        partition = f"step-{step}"
                        tq.kv_batch_put(keys=["owner"], partition_id=partition, tags=[{}])  # A owns it
                        keys, fields, tags = _trajectories(0, step, args.prompts, args.n, args.seed)
                        times.append(ray.get(worker.step.remote(partition, keys, fields, tags)))
                        tq.kv_clear(keys=[*keys, "owner"], partition_id=partition)
                        step += 1
                    if run:
                        put = statistics.median(t[0] for t in times)
                        get = statistics.median(t[1] for t in times)
                        results[label].append((put, get))
                        print(f"run {run} {label}: put {put * 1e3:.1f} ms, get {get * 1e3:.1f} ms", file=sys.stderr)
        finally:
            tq.close()
            ray.shutdown()
            cluster.shutdown()
    _, fields, _ = _trajectories(0, 0, args.prompts, args.n, args.seed)
    import torch

    tensors = [v.values() if v.is_nested else v for v in fields.values() if isinstance(v, torch.Tensor)]
    mib = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    print(f"python -m bench verl-nodes {' '.join(sys.argv[2:] if argv is None else argv)}".rstrip())
    print(f"a step: {args.prompts * args.n} trajectories, {mib:.1f} MiB of tensors; median of {args.repeat} runs")
    print("| worker | kv_batch_put | kv_batch_get | put + get | vs one node |")
    print("|---|---|---|---|---|")
    base = statistics.median(p + g for p, g in results["one node"])
    for label, runs in results.items():
        put = statistics.median(p for p, _ in runs)
        get = statistics.median(g for _, g in runs)
        total = statistics.median(p + g for p, g in runs)
        print(f"| {label} | {put * 1e3:.1f} ms | {get * 1e3:.1f} ms | {total * 1e3:.1f} ms | {total / base:.2f}x |")
    return 0
