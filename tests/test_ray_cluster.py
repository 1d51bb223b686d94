"""persisting.ray on a real local Ray cluster: ``ray.cluster_utils.Cluster`` with a head and two worker raylets,
each a node with its own broker (subprocess of its actor), storage folder, socket and arena file.

Producers run on node A, consumers of one task on node B (Ray tasks pinned by custom resources); every
acknowledged sample must be taken exactly once, with its bytes; kill -9 of A's broker and the removal of a
raylet are done for real. Skipped without the ``ray`` extra.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

import persisting.ray as pray  # noqa: E402 - after the skip: it needs ray
from persisting.tensors.arena import default_path  # noqa: E402

OBJECT_STORE_BYTES = 128 * 1024 * 1024
ARENA_BYTES = 64 * 1024 * 1024
WIDTH = 2048  # float32 per sample: 8 KiB, so a batch of 16 goes through Ray's object store, not inline


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    c = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES},
    )
    nodes = {
        name: c.add_node(num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, resources={name: 100})
        for name in ("node_a", "node_b")
    }
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="persisting-tests", log_to_driver=False)
    root = tmp_path_factory.mktemp("ray-cluster")
    try:
        pray.start(str(root), arena_bytes=ARENA_BYTES)
        yield c, nodes, root
    finally:
        try:
            pray.stop()
        finally:
            ray.shutdown()
            c.shutdown()
            # a broker killed with its raylet leaves its arena file (a clean stop removes its own)
            for storage in root.iterdir():
                default_path(storage).unlink(missing_ok=True)


def on(name: str) -> dict[str, Any]:
    return {"resources": {name: 1}, "num_cpus": 0}


@ray.remote
def produce(topic: str, partition: str, ids: list[int], batch: int, flush: bool = True) -> list[int]:
    """Put samples whose row i is ``ids[i]`` everywhere; returns the ids whose put was acknowledged."""
    q = pray.SyncQueue(topic, durability="sync")
    done: list[int] = []
    for at in range(0, len(ids), batch):
        chunk = np.asarray(ids[at : at + batch], dtype=np.int64)
        x = np.repeat(chunk.astype(np.float32)[:, None], WIDTH, axis=1)
        q.put({"x": x, "id": chunk}, partition_id=partition)
        done.extend(chunk.tolist())
    if flush:
        q.flush()
    q.close()
    return done


@ray.remote
def consume(topic: str, partition: str, task: str, batch: int, idle_s: float, limit: int = 10**9) -> dict[str, Any]:
    """Take batches until one waits ``idle_s`` for nothing (or ``limit`` samples); ids taken, checked bytes."""
    q = pray.SyncQueue(topic, durability="sync")
    ids: list[int] = []
    read_only = True
    while len(ids) < limit:
        data, meta = q.get_batch(["x", "id"], min(batch, limit - len(ids)), task, partition, wait=True, timeout=idle_s)
        if meta.size == 0:
            break
        x, got = data["x"], np.asarray(data["id"])
        if not np.array_equal(x, np.repeat(got.astype(np.float32)[:, None], WIDTH, axis=1)):
            raise AssertionError(f"bytes of samples {got.tolist()} differ from what was put")
        read_only = read_only and not x.flags.writeable
        ids.extend(got.tolist())
    owner = q.owner(partition)
    q.close()
    return {"ids": ids, "node": ray.get_runtime_context().get_node_id(), "owner": owner, "read_only": read_only}


def exactly_once(acknowledged: list[int], takes: list[dict[str, Any]]) -> None:
    taken = Counter(i for t in takes for i in t["ids"])
    doubled = sorted(i for i, n in taken.items() if n > 1)
    missing = sorted(set(acknowledged) - set(taken))
    foreign = sorted(set(taken) - set(acknowledged))
    assert not doubled and not missing and not foreign, (doubled[:10], missing[:10], foreign[:10])


def test_producers_on_a_consumers_on_b_take_every_sample_exactly_once(cluster: Any) -> None:
    _, nodes, _ = cluster
    ids = [list(range(p * 10_000, p * 10_000 + 480)) for p in range(2)]
    producers = [produce.options(**on("node_a")).remote("t1", "step-0", i, 16) for i in ids]
    consumers = [consume.options(**on("node_b")).remote("t1", "step-0", "train", 16, 3.0) for _ in range(2)]
    acknowledged = [i for part in ray.get(producers) for i in part]
    takes = ray.get(consumers)
    takes.append(ray.get(consume.options(**on("node_b")).remote("t1", "step-0", "train", 64, 1.0)))  # the rest
    exactly_once(acknowledged, takes)
    assert all(t["node"] == nodes["node_b"].node_id and t["owner"] == nodes["node_a"].node_id for t in takes)
    assert all(t["read_only"] for t in takes if t["ids"])  # views on B's object store, not private copies
    # another task sees every sample again, once; a consumer on the owner's node gets them from the arena
    local = ray.get(consume.options(**on("node_a")).remote("t1", "step-0", "eval", 64, 1.0))
    exactly_once(acknowledged, [local])
    assert local["owner"] == local["node"] == nodes["node_a"].node_id


def test_kill_9_of_node_a_broker_loses_nothing_acknowledged(cluster: Any) -> None:
    _, nodes, _ = cluster
    node_a = nodes["node_a"].node_id
    actor, key = pray.node_actor(node_a), pray.node_key(node_a)
    before = ray.get(actor.restarts.remote(key))
    producer = produce.options(**on("node_a")).remote("t2", "p", list(range(2_000)), 8)
    consumer = consume.options(**on("node_b")).remote("t2", "p", "train", 8, 8.0)
    time.sleep(1.5)  # mid-stream: both sides are running (a put every few ms)
    pid = ray.get(actor.broker_pid.remote(key))
    os.kill(pid, signal.SIGKILL)
    acknowledged = ray.get(producer, timeout=120)
    takes = [ray.get(consumer, timeout=120)]
    takes.append(ray.get(consume.options(**on("node_b")).remote("t2", "p", "train", 64, 1.0)))
    exactly_once(acknowledged, takes)
    assert ray.get(actor.restarts.remote(key)) == before + 1
    assert ray.get(actor.broker_pid.remote(key)) != pid


def test_a_removed_raylet_moves_its_broker_to_a_live_node(cluster: Any) -> None:
    """Node C's raylet goes (its actor and, by PDEATHSIG, its broker die with it). A consumer on B that finds
    C unreachable has the registry move C's broker to B, on C's storage (a shared folder here): every
    acknowledged and flushed sample is still there, and what the task took before is not handed out again."""
    c, nodes, root = cluster
    node_c = c.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES, resources={"node_c": 100})
    c.wait_for_nodes()
    pray.start(str(root), arena_bytes=ARENA_BYTES)  # a broker for the new node; the others keep theirs
    acknowledged = ray.get(produce.options(**on("node_c")).remote("t3", "p", list(range(320)), 16))
    first = ray.get(consume.options(**on("node_b")).remote("t3", "p", "train", 16, 1.0, 96))
    assert len(first["ids"]) == 96 and first["owner"] == node_c.node_id
    broker_pid = ray.get(pray.node_actor(node_c.node_id).broker_pid.remote(pray.node_key(node_c.node_id)))
    c.remove_node(node_c, allow_graceful=False)
    _wait_gone(broker_pid)
    rest = ray.get(consume.options(**on("node_b")).remote("t3", "p", "train", 64, 2.0), timeout=120)
    exactly_once(acknowledged, [first, rest])
    assert rest["owner"] == nodes["node_b"].node_id
    owners = ray.get(pray.registry().owners.remote())
    assert owners["hosts"][pray.node_key(node_c.node_id)] == nodes["node_b"].node_id
    assert Path(owners["storage"][pray.node_key(node_c.node_id)]).is_dir()


def _wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"broker {pid} outlived its raylet")
