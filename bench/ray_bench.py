"""``python -m bench ray``: tensor hand-over between two nodes of a local Ray cluster (the ``ray`` extra).

A ``ray.cluster_utils.Cluster`` with a head and two worker raylets (A, B), ``persisting.ray.start`` on it (one
broker per node, each with its own storage, socket and arena). Per batch size, in the same run:

- persisting cross-node: a producer task on A puts the batches (claiming the partition for A's broker: the
  arena), then a consumer task on B takes them with ``get_batch`` (A's actor takes them from its broker and
  returns the arrays through Ray's object store);
- ray.put/ray.get: an actor on A ``ray.put``s the same arrays, a task on B ``ray.get``s them;
- persisting same-node: the consumer on A (arena views);
- memcpy: ``np.copyto`` of the same bytes in the consumer task (the copy floor).

Each: the put phase, then the get phase (seconds, GB/s of the get phase and of both), every batch checked.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

SHAPES = {  # name -> (samples per batch, float32 per sample)
    "6 MiB": (256, 6144),
    "64 MiB": (64, 262144),
}
OBJECT_STORE_BYTES = 768 * 1024 * 1024


def _batch(samples: int, width: int, i: int) -> dict[str, np.ndarray]:
    x = np.empty((samples, width), dtype=np.float32)
    x[:] = np.arange(i * samples, (i + 1) * samples, dtype=np.float32)[:, None]
    return {"x": x}


def _check(x: np.ndarray, i: int) -> None:
    first = x.shape[0] * i
    if x[0, 0] != first or x[-1, -1] != first + x.shape[0] - 1:
        raise RuntimeError(f"batch {i} arrived with other bytes")


def run_ray_bench(base: Path, *, batches: dict[str, int], reps: int) -> list[dict[str, Any]]:
    import ray
    from ray.cluster_utils import Cluster

    import persisting.ray as pray

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 256 * 2**20})
    nodes = {n: cluster.add_node(num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, resources={n: 100}) for n in "AB"}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="persisting-bench", log_to_driver=False)
    rows: list[dict[str, Any]] = []
    try:
        pray.start(str(base / "storage"), arena_bytes=768 * 2**20)

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

        on: dict[str, dict[str, Any]] = {n: {"resources": {n: 1}} for n in "AB"}
        for label, n in batches.items():
            samples, width = SHAPES[label]
            nbytes = samples * width * 4 * n
            times: dict[str, list[tuple[float, float]]] = {}
            for rep in range(reps + 1):  # the first is a warm-up: topics opened, actors and connections made
                for case, consumer in (("persisting cross-node (A -> B)", "B"), ("persisting same-node (A)", "A")):
                    topic, partition = f"{label.replace(' ', '')}-{consumer}", f"rep-{rep}"
                    put_s = ray.get(produce.options(**on["A"]).remote(topic, partition, samples, width, n))
                    get_s = ray.get(consume.options(**on[consumer]).remote(topic, partition, samples, n))
                    if rep:
                        times.setdefault(case, []).append((put_s, get_s))
                producer: Any = ray.remote(RayProducer).options(num_cpus=0, **on["A"]).remote()
                put_s, refs = ray.get(producer.put.remote(samples, width, n))
                get_s = ray.get(ray_get.options(**on["B"]).remote(refs))
                del refs
                ray.kill(producer)
                copy_s = ray.get(memcpy.options(**on["B"]).remote(samples, width, n))
                if rep:
                    times.setdefault("ray.put on A, ray.get on B", []).append((put_s, get_s))
                    times.setdefault("memcpy (np.copyto) on B", []).append((0.0, copy_s))
            for case, runs in times.items():
                put_s = statistics.median(p for p, _ in runs)
                get_s = statistics.median(g for _, g in runs)
                rows.append(
                    {
                        "case": case,
                        "batch": label,
                        "batches": n,
                        "put_s": put_s,
                        "get_s": get_s,
                        "get_gbps": nbytes / get_s / 1e9,
                        "total_gbps": nbytes / (put_s + get_s) / 1e9,
                    }
                )
        del nodes
    finally:
        try:
            pray.stop()
        finally:
            ray.shutdown()
            cluster.shutdown()
    return rows


def render_ray(rows: list[dict[str, Any]]) -> str:
    out = [
        "| path | batch | batches | put s | get s | get GB/s | put+get GB/s | get vs ray.get |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = next(x for x in rows if x["batch"] == r["batch"] and x["case"].startswith("ray.put"))
        out.append(
            f"| {r['case']} | {r['batch']} | {r['batches']} | {r['put_s']:.3f} | {r['get_s']:.3f} | "
            f"{r['get_gbps']:.2f} | {r['total_gbps']:.2f} | {ref['get_s'] / r['get_s']:.2f}x |"
        )
    return "\n".join(out)
