"""The workload of ``python -m bench ray``: tensor hand-over between two nodes of a local Ray cluster (the ``ray``
extra).

A ``ray.cluster_utils.Cluster`` with a head and two worker raylets (A, B), ``persisting.ray.start`` on it (one
broker per node, each with its own storage, socket and arena). Per batch size, in the same run:

- persisting cross-node: a producer task on A puts the batches (claiming the partition for A's broker: the
  arena), then a consumer task on B takes them with ``get_batch`` (A's actor takes them from its broker and
  returns the arrays through Ray's object store);
- ray.put/ray.get: an actor on A ``ray.put``s the same arrays, a task on B ``ray.get``s them;
- persisting same-node: the consumer on A (arena views);
- memcpy: ``np.copyto`` of the same bytes in the consumer task (the copy floor).

Each: the put phase, then the get phase (seconds of each), every batch checked; the first round of each size is a
warm-up (topics opened, actors and connections made), then ``reps`` rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import persisting.ray as pray

SHAPES = {  # name -> (samples per batch, float32 per sample)
    "6 MiB": (256, 6144),
    "64 MiB": (64, 262144),
}
OBJECT_STORE_BYTES = 768 * 1024 * 1024
RAY = "ray.put on A, ray.get on B"  # the reference


def _batch(samples: int, width: int, i: int) -> dict[str, np.ndarray]:
    x = np.empty((samples, width), dtype=np.float32)
    x[:] = np.arange(i * samples, (i + 1) * samples, dtype=np.float32)[:, None]
    return {"x": x}


def _check(x: np.ndarray, i: int) -> None:
    first = x.shape[0] * i
    if x[0, 0] != first or x[-1, -1] != first + x.shape[0] - 1:
        raise RuntimeError(f"batch {i} arrived with other bytes")


Times = dict[str, list[tuple[float, float]]]  # case -> (put s, get s) per rep


def run_ray_bench(
    base: Path, *, batches: dict[str, int], reps: int, say: Callable[[str], None] = print
) -> dict[str, Times]:
    """Batch size label -> its cases' seconds per rep (``batches``: size label -> batches per run)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 256 * 2**20})
    for n in "AB":
        cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, resources={n: 100})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="persisting-bench", log_to_driver=False)
    try:
        pray.start(str(base / "storage"), arena_bytes=768 * 2**20)
        tasks = _tasks(ray, pray)
        out = {}
        for label, count in batches.items():
            say(f"{label}: {count} batches, {reps} reps after a warm-up")
            out[label] = _one_size(ray, tasks, label, count, reps)
        return out
    finally:
        try:
            pray.stop()
        finally:
            ray.shutdown()
            cluster.shutdown()


def _one_size(ray: Any, tasks: dict[str, Any], label: str, n: int, reps: int) -> Times:
    samples, width = SHAPES[label]
    on: dict[str, dict[str, Any]] = {node: {"resources": {node: 1}} for node in "AB"}
    times: Times = {}
    for rep in range(reps + 1):  # the first is a warm-up: topics opened, actors and connections made
        for case, consumer in (("persisting cross-node (A -> B)", "B"), ("persisting same-node (A)", "A")):
            topic, partition = f"{label.replace(' ', '')}-{consumer}", f"rep-{rep}"
            put_s = ray.get(tasks["produce"].options(**on["A"]).remote(topic, partition, samples, width, n))
            get_s = ray.get(tasks["consume"].options(**on[consumer]).remote(topic, partition, samples, n))
            if rep:
                times.setdefault(case, []).append((put_s, get_s))
        producer: Any = ray.remote(tasks["RayProducer"]).options(num_cpus=0, **on["A"]).remote()
        put_s, refs = ray.get(producer.put.remote(samples, width, n))
        get_s = ray.get(tasks["ray_get"].options(**on["B"]).remote(refs))
        del refs
        ray.kill(producer)
        copy_s = ray.get(tasks["memcpy"].options(**on["B"]).remote(samples, width, n))
        if rep:
            times.setdefault(RAY, []).append((put_s, get_s))
            times.setdefault("memcpy (np.copyto) on B", []).append((0.0, copy_s))
    return times


def _tasks(ray: Any, pray: Any) -> dict[str, Any]:
    """The remote functions and the producer actor's class, defined here so that Ray ships them by value."""

    @ray.remote(num_cpus=0)
    def produce(topic: str, partition: str, samples: int, width: int, n: int) -> float:
        q = pray.SyncQueue(topic, durability="process")
        batches = [_batch(samples, width, i) for i in range(n)]
        t0 = time.perf_counter()
        for b in batches:
            q.put(b, partition_id=partition)
        took = time.perf_counter() - t0
        q.close()
        return took

    @ray.remote(num_cpus=0)
    def consume(topic: str, partition: str, samples: int, n: int) -> float:
        q = pray.SyncQueue(topic, durability="process")
        t0 = time.perf_counter()
        for i in range(n):
            data, meta = q.get_batch(["x"], samples, "t", partition, wait=True, timeout=60)
            _check(data["x"], i)
            del data, meta
        took = time.perf_counter() - t0
        q.close()
        return took

    class RayProducer:
        def put(self, samples: int, width: int, n: int) -> tuple[float, list[Any]]:
            batches = [_batch(samples, width, i) for i in range(n)]
            t0 = time.perf_counter()
            refs = [ray.put(b) for b in batches]
            return time.perf_counter() - t0, refs

    @ray.remote(num_cpus=0)
    def ray_get(refs: list[Any]) -> float:
        t0 = time.perf_counter()
        for i, ref in enumerate(refs):
            data = ray.get(ref)
            _check(data["x"], i)
            del data
        return time.perf_counter() - t0

    @ray.remote(num_cpus=0)
    def memcpy(samples: int, width: int, n: int) -> float:
        src, dst = _batch(samples, width, 0)["x"], np.empty((samples, width), dtype=np.float32)
        t0 = time.perf_counter()
        for _ in range(n):
            np.copyto(dst, src)
        return time.perf_counter() - t0

    return {"produce": produce, "consume": consume, "RayProducer": RayProducer, "ray_get": ray_get, "memcpy": memcpy}
