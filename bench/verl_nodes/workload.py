"""The workload of ``python -m bench verl-nodes``: one verl-sized step through the TransferQueue layer on two Ray
nodes.

A local Ray cluster of two raylets on this machine (``ray.cluster_utils.Cluster``: the head is node A, where the
driver runs and owns every partition, and node B), each with its own broker (``persisting.ray``). A worker actor
``kv_batch_put``s one step's trajectories (bench/common/verl_steps.py: jagged prompts, responses, ids, masks and
scores, a NonTensorStack of dicts, verl's tags) into a partition A owns, then ``kv_batch_get``s all of it back;
``kv_clear`` ends the step. The reference, in the same run and cluster: the same worker pinned to A (its own
node's broker over ipc). Each rep times ``--steps`` steps per worker (the workers alternating), after one warm-up
step per worker; the harness takes the medians.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import persisting.compat.transfer_queue as tq
from bench.common.verl_steps import trajectories

STORE_BYTES = 512 * 1024 * 1024  # each raylet's object store
ARENA_BYTES = 512 << 20
WORKERS = {"one node": "node_a", "two nodes": "node_b"}  # the worker's label -> the resource that pins it


class StepWorker:
    """A rollout worker timing its own calls (a Ray actor pinned to one node)."""

    def __init__(self) -> None:
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


def run(
    work: Path, prompts: int, n: int, steps: int, reps: int, seed: int, say: Callable[[str], None]
) -> dict[str, list[tuple[float, float]]]:
    """Worker label -> (put s, get s) of every timed step."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": STORE_BYTES, "resources": {"node_a": 10}},
    )
    cluster.add_node(num_cpus=2, object_store_memory=STORE_BYTES, resources={"node_b": 10})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        tq.init({"persisting": {"storage_path": str(work / "storage"), "arena_bytes": ARENA_BYTES}})
        actor: Any = ray.remote(num_cpus=0)(StepWorker)
        workers = {label: actor.options(resources={node: 1}).remote() for label, node in WORKERS.items()}
        results: dict[str, list[tuple[float, float]]] = {label: [] for label in workers}
        step = 0
        for rep in range(reps + 1):  # rep 0: one warm-up step per worker
            for label, worker in workers.items():
                for _ in range(1 if rep == 0 else steps):
                    partition = f"step-{step}"
                    tq.kv_batch_put(keys=["owner"], partition_id=partition, tags=[{}])  # A owns it
                    keys, fields, tags = trajectories(0, step, prompts, n, seed)
                    took = ray.get(worker.step.remote(partition, keys, fields, tags))
                    tq.kv_clear(keys=[*keys, "owner"], partition_id=partition)
                    step += 1
                    if rep:
                        results[label].append(took)
            say(f"rep {rep} of {reps} done" if rep else "warm-up done")
        return results
    finally:
        tq.close()
        ray.shutdown()
        cluster.shutdown()


def step_mib(prompts: int, n: int, seed: int) -> float:
    """MiB of tensors in one step."""
    import torch

    _, fields, _ = trajectories(0, 0, prompts, n, seed)
    tensors = [v.values() if v.is_nested else v for v in fields.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20
