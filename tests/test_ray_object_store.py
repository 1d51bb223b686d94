"""persisting.ray on object storage: a real local Ray cluster (head + raylets A and B) whose brokers store in a
real S3-compatible server (moto's, a subprocess), each with its own local folder for its log.

Producers on A put and flush, a consumer on B takes part of the partition, A's raylet is removed: the registry
moves A's broker to B on the same S3 prefix with a fresh local folder, which waits out A's lease and serves every
flushed sample; A's consumption state was local, so what B took before comes again. Needs the ``ray`` and ``s3``
extras; skipped without them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")
pytest.importorskip("moto.server", reason="the s3 extra (moto[server]) runs a local S3 server")

import persisting.ray as pray  # noqa: E402 - after the skips
from persisting.errors import ConfigError  # noqa: E402
from persisting.tensors.arena import default_path  # noqa: E402
from persisting.testing.s3_server import start_s3_server  # noqa: E402

from .test_ray_cluster import ARENA_BYTES, OBJECT_STORE_BYTES, _wait_gone, consume, on, produce  # noqa: E402

LEASE_S = 3.0  # PERSISTING_OWNER_LEASE_S of every node: the adopter takes A's topics over within seconds
SECRET = f"s3cret-{uuid.uuid4().hex}"  # moto takes any key: this one must show in no command line and no log


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    s3 = start_s3_server()
    root = tmp_path_factory.mktemp("ray-s3")
    local_root, logs = root / "local", root / "logs"
    saved = os.environ.get("PERSISTING_OWNER_LEASE_S")
    os.environ["PERSISTING_OWNER_LEASE_S"] = str(LEASE_S)  # raylets, their workers and brokers inherit it
    c = None
    try:
        c = cluster_utils.Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES}
        )
        nodes = {
            name: c.add_node(num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, resources={name: 100})
            for name in ("node_a", "node_b")
        }
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="persisting-tests", log_to_driver=False)
        uri = f"s3://{s3.new_bucket()}/cluster"
        options = {**s3.options(), "aws_secret_access_key": SECRET}
        pray.start(uri, storage_options=options, local_root=str(local_root), arena_bytes=ARENA_BYTES, log_dir=str(logs))
        yield {"cluster": c, "nodes": nodes, "uri": uri, "local_root": local_root, "logs": logs}
    finally:
        try:
            if ray.is_initialized():
                pray.stop()
        finally:
            ray.shutdown()
            if c is not None:
                c.shutdown()
            s3.stop()
            if saved is None:
                os.environ.pop("PERSISTING_OWNER_LEASE_S", None)
            else:
                os.environ["PERSISTING_OWNER_LEASE_S"] = saved
            if local_root.is_dir():  # a broker killed with its raylet leaves its arena (a clean stop removes its own)
                for local in local_root.iterdir():
                    default_path(local).unlink(missing_ok=True)


def test_a_bad_storage_root_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="s3://bucket/prefix"):
        pray.start("s3:/bucket/prefix")
    with pytest.raises(ConfigError, match="storage_options apply to an object-store"):
        pray.start(str(tmp_path), storage_options={"region": "x"})
    with pytest.raises(ConfigError, match="local_path applies to an object-store"):
        pray.start(str(tmp_path), local_root=str(tmp_path / "local"))


@ray.remote
def put_records(topic: str, flushed: list[int], unflushed: list[int]) -> None:
    """Records (no arena, so no write-behind) on a topic whose background flush never comes within the test."""
    q = pray.SyncQueue(topic, batch_size=10**6, auto_flush_interval_sec=0.0)
    q.put_batch([{"id": i} for i in flushed], partition_id="p")
    q.flush()
    q.put_batch([{"id": i} for i in unflushed], partition_id="p")  # acknowledged: in A's local log only
    q.close()


@ray.remote
def take_records(topic: str) -> list[int]:
    q = pray.SyncQueue(topic, batch_size=10**6, auto_flush_interval_sec=0.0)
    data, meta = q.get_batch(["id"], 1000, "train", "p", wait=True, timeout=2.0)
    q.close()
    return [int(i) for i in data["id"]] if meta.size else []


@ray.remote
def lease_s() -> float:
    return float(os.environ.get("PERSISTING_OWNER_LEASE_S", "nan"))


def test_each_node_stores_under_its_prefix_and_the_options_stay_out_of_sight(cluster: dict[str, Any]) -> None:
    nodes = cluster["nodes"]
    assert ray.get(lease_s.options(**on("node_b")).remote()) == LEASE_S
    owners = ray.get(pray.registry().owners.remote())
    node_b = nodes["node_b"].node_id
    key = pray.node_key(node_b)
    assert owners["storage"][key] == f"{cluster['uri']}/{key}"
    actor = pray.node_actor(node_b)
    assert ray.get(actor.local_paths.remote()) == {key: str(cluster["local_root"] / key)}
    pid = ray.get(actor.broker_pid.remote(key))
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[cmdline.index(b"--storage-path") + 1].decode() == f"{cluster['uri']}/{key}"
    assert SECRET.encode() not in b" ".join(cmdline)
    assert SECRET.encode() in Path(f"/proc/{pid}/environ").read_bytes()  # how it got them: its environment
    for log in cluster["logs"].iterdir():
        assert SECRET not in log.read_text(errors="replace"), log.name


def test_node_a_removed_its_partition_moves_to_b_every_flushed_sample_comes_back(cluster: dict[str, Any]) -> None:
    """A puts 320 samples and flushes, then puts 64 it does not flush; B takes 96; A's raylet goes. B adopts A's
    broker on A's S3 prefix with a fresh local folder: after A's lease it serves the 320 flushed samples, each
    once; the 96 B took before come again (A's consumption log was on A's disk); of the 64 unflushed, those the
    background flush had not written are lost, and none comes twice. On a records topic whose background flush is
    not due, the records put after the last flush are lost: exactly the flushed ones come back."""
    c, nodes = cluster["cluster"], cluster["nodes"]
    node_a, node_b = nodes["node_a"].node_id, nodes["node_b"].node_id
    key_a = pray.node_key(node_a)
    flushed = ray.get(produce.options(**on("node_a")).remote("t", "p", list(range(320)), 16))
    unflushed = ray.get(produce.options(**on("node_a")).remote("t", "p", list(range(320, 384)), 16, False))
    ray.get(put_records.options(**on("node_a")).remote("u", list(range(50)), list(range(50, 80))))
    first = ray.get(consume.options(**on("node_b")).remote("t", "p", "train", 16, 1.0, 96))
    assert len(first["ids"]) == 96 and first["owner"] == node_a and first["node"] == node_b
    assert not list(cluster["local_root"].glob(f"{key_a}.on-*"))

    pid_a = ray.get(pray.node_actor(node_a).broker_pid.remote(key_a))
    c.remove_node(nodes["node_a"], allow_graceful=False)
    _wait_gone(pid_a)
    started = time.monotonic()
    rest = ray.get(consume.options(**on("node_b")).remote("t", "p", "train", 64, 2.0), timeout=120)
    took_s = time.monotonic() - started

    taken = Counter(rest["ids"])
    assert not [i for i, n in taken.items() if n > 1], "a sample came twice from the adopted broker"
    assert set(flushed) <= set(taken), sorted(set(flushed) - set(taken))[:10]  # nothing flushed is lost
    assert set(taken) <= set(flushed) | set(unflushed)  # nothing that was not acknowledged
    assert set(first["ids"]) <= set(taken)  # A's consumption state is gone: what B took comes again
    assert rest["owner"] == node_b
    owners = ray.get(pray.registry().owners.remote())
    assert owners["hosts"][key_a] == node_b and owners["storage"][key_a] == f"{cluster['uri']}/{key_a}"
    # records put after the last flush, with no background flush due: acknowledged by A's log, lost with A's disk
    assert sorted(ray.get(take_records.options(**on("node_b")).remote("u"))) == list(range(50))
    adopted = ray.get(pray.node_actor(node_b).local_paths.remote())[key_a]
    assert adopted == str(cluster["local_root"] / f"{key_a}.on-{pray.node_key(node_b)}")
    print(
        f"adopted after {took_s:.1f} s (lease {LEASE_S} s); of {len(unflushed)} unflushed samples "
        f"{len(set(unflushed) & set(taken))} had been flushed in the background"
    )


def test_the_adopted_partition_takes_new_puts_and_keeps_its_indexes(cluster: dict[str, Any]) -> None:
    """After the move, puts to A's partition go to the adopted broker on B, after the indexes already in S3."""
    nodes = cluster["nodes"]
    more = ray.get(produce.options(**on("node_b")).remote("t", "p", list(range(1000, 1032)), 16))
    got = ray.get(consume.options(**on("node_b")).remote("t", "p", "train", 64, 1.0))
    assert sorted(got["ids"]) == more and got["owner"] == nodes["node_b"].node_id
