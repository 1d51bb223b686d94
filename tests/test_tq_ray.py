"""The TransferQueue layer on several nodes, on a real local Ray cluster: the head is node A (where this test
process, the trainer, runs) and a second raylet is node B, each with its own broker (``persisting.ray``).

A rollout worker is a Ray actor pinned to B; it reaches the layer as verl's workers do (``tq.init()`` with no
conf). Values are compared exactly (jagged tokens, dense scalars, Python objects), tags merged, ``kv_list`` and
``kv_clear`` across nodes; kill -9 of B's broker and of a worker mid-stream lose nothing acknowledged (seeds
printed). One cluster for the module (a cluster start costs seconds). Skipped without the ``ray`` extra.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")
torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")

import persisting.compat.transfer_queue as tq  # noqa: E402
import persisting.ray as pray  # noqa: E402 - after the skips: it needs ray
from persisting.compat.transfer_queue import ray_hosts  # noqa: E402
from persisting.tensors.arena import default_path  # noqa: E402

OBJECT_STORE_BYTES = 128 * 1024 * 1024
ARENA_BYTES = 64 * 1024 * 1024
TOPIC = "transfer_queue"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    c = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "object_store_memory": OBJECT_STORE_BYTES, "resources": {"node_a": 100}},
    )
    node_b = c.add_node(num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, resources={"node_b": 100})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="persisting-tq-tests", log_to_driver=False)
    root = tmp_path_factory.mktemp("tq-ray")
    try:
        tq.init({"persisting": {"storage_path": str(root), "arena_bytes": ARENA_BYTES}})  # 2 nodes: the ray plane
        yield {"a": ray.get_runtime_context().get_node_id(), "b": node_b.node_id, "root": root}
    finally:
        try:
            tq.close()  # the run's first init: stops the hosts and the brokers it started
        finally:
            ray.shutdown()
            c.shutdown()
            for storage in root.iterdir():  # a broker killed with its raylet leaves its arena file
                if storage.is_dir():
                    default_path(storage).unlink(missing_ok=True)


class Rollout:
    """A rollout worker: attaches to the layer as verl's workers do."""

    def __init__(self) -> None:
        import persisting.compat.transfer_queue as layer

        layer.init()
        self.tq = layer

    def where(self) -> tuple[str, int, str]:
        return ray.get_runtime_context().get_node_id(), os.getpid(), type(self.tq.interface._plane).__name__

    def call(self, name: str, *args: Any, **kw: Any) -> Any:
        return getattr(self.tq, name)(*args, **kw)

    def scribble(self, keys: list[str], partition: str) -> Any:
        """Read the keys, write into what was read (verl changes the tensors it gets), read them again."""
        got = self.tq.kv_batch_get(keys=keys, partition_id=partition)
        got["scores"] += 1
        got["responses"].values()[:] = -1
        return self.tq.kv_batch_get(keys=keys, partition_id=partition)

    def bridge(self, keys: list[str], partition: str) -> Any:
        """verl's worker-group bridge on another node: the keys' meta, their columns, an output column written
        back by meta (``put(data, metadata=)``), then the meta again."""
        client = self.tq.get_client()
        meta = client.kv_retrieve_meta(keys=keys, partition_id=partition, create=False)
        data = client.get_data(meta.select_fields(["responses"]))
        out = tensordict.TensorDict(
            {"old_log_probs": torch.stack([r.float().sum() for r in data["responses"].unbind()])},
            batch_size=[len(keys)],
        )
        client.put(data=out, metadata=meta)
        return client.kv_retrieve_meta(keys=keys, partition_id=partition, create=False), client.kv_retrieve_keys(
            global_indexes=meta.global_indexes, partition_id=partition
        )

    def put_stream(self, partition: str, n: int, acks: str, pause_s: float = 0.0, stop: str = "") -> int:
        """Put keys w0..w<n-1> one call each (until the file ``stop`` exists); a key's name goes to ``acks`` once
        its put returned. Returns how many were put."""
        with open(acks, "a") as out:
            for i in range(n):
                if stop and os.path.exists(stop):
                    return i
                self.tq.kv_batch_put(keys=[f"w{i}"], partition_id=partition, fields=sample(i), tags=[{"i": i}])
                out.write(f"{i}\n")
                out.flush()
                time.sleep(pause_s)
        return n


RolloutActor: Any = ray.remote(num_cpus=0, max_concurrency=2)(Rollout)


def on(name: str) -> dict[str, Any]:
    return {"resources": {name: 1}}


def sample(i: int) -> Any:
    """Key ``w<i>``'s fields: jagged tokens, a dense scalar and a Python object, all made from ``i``."""
    tokens = torch.nested.nested_tensor([torch.arange(i, i + 1 + i % 7, dtype=torch.int64)], layout=torch.jagged)
    return tensordict.TensorDict(
        {
            "responses": tokens,
            "rewards": torch.tensor([float(i)]),
            "extra": tensordict.NonTensorStack({"turns": [{"role": "assistant", "n": i}]}),
        },
        batch_size=[1],
    )


def trajectories(keys: list[str], seed: int) -> Any:
    """verl-shaped rows: jagged prompts and responses of varying lengths, dense scores, dicts of messages."""
    rng = random.Random(seed)
    n = len(keys)
    prompts = [torch.tensor([rng.randrange(32_000) for _ in range(rng.randint(3, 40))]) for _ in range(n)]
    responses = [torch.tensor([rng.randrange(32_000) for _ in range(rng.randint(1, 90))]) for _ in range(n)]
    return tensordict.TensorDict(
        {
            "prompts": torch.nested.nested_tensor(prompts, layout=torch.jagged),
            "responses": torch.nested.nested_tensor(responses, layout=torch.jagged),
            "scores": torch.tensor([rng.random() for _ in range(n)]),
            "messages": tensordict.NonTensorStack(*({"messages": [{"role": "user", "k": k}]} for k in keys)),
        },
        batch_size=[n],
    )


def same_rows(got: Any, want: Any, names: list[str], order: list[int] | None = None) -> None:
    """Row r of ``got`` is row ``order[r]`` of ``want`` (the same row by default), column by column, exactly."""
    order = list(range(want.batch_size[0])) if order is None else order
    for name in names:
        a, b = got.get(name), want.get(name)
        if isinstance(b, torch.Tensor) and b.is_nested:
            assert a.is_nested and len(a.unbind()) == len(order), name
            rows = b.unbind()
            for x, r in zip(a.unbind(), order, strict=True):
                assert torch.equal(x, rows[r]), name
        elif isinstance(b, torch.Tensor):
            assert torch.equal(a, b[torch.tensor(order)]), name
        else:
            rows = b.tolist()
            assert a.tolist() == [rows[r] for r in order], name


def owner_of(partition: str) -> str:
    found = ray.get(pray.registry().owner.remote(TOPIC, partition, 0.0))
    assert found is not None, partition
    return str(found[1])


def test_a_worker_on_b_writes_into_a_partition_a_owns(nodes: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    keys = [f"uid{i}_0" for i in range(12)]
    prompts = trajectories(keys, seed).select("prompts")
    pending = [{"uid": k, "status": "pending"} for k in keys]
    tq.kv_batch_put(keys=keys, partition_id="train", fields=prompts, tags=pending)
    assert owner_of("train") == nodes["a"]  # the trainer's first put claimed it

    worker = RolloutActor.options(**on("node_b")).remote()
    where, _, plane = ray.get(worker.where.remote())
    assert where == nodes["b"] and plane == "RayPlane"
    rollout = trajectories(keys, seed).exclude("prompts")
    tags = [{"status": "done", "score": float(s)} for s in rollout["scores"]]
    meta = ray.get(worker.call.remote("kv_batch_put", keys=keys, partition_id="train", fields=rollout, tags=tags))
    assert meta.partition_id == "train" and meta.tags == [{"uid": k, **t} for k, t in zip(keys, tags, strict=True)]

    want = trajectories(keys, seed)
    got = tq.kv_batch_get(keys=keys, partition_id="train")  # on A: its own store, over ipc
    assert sorted(got.keys()) == sorted(want.keys())
    same_rows(got, want, list(want.keys()))
    assert got["responses"].offsets() is not None  # jagged, as TransferQueue hands token columns back
    remote = ray.get(worker.call.remote("kv_batch_get", keys=keys[::-1], partition_id="train"))  # B reads A's
    same_rows(remote, want, list(want.keys()), list(range(len(keys)))[::-1])
    same_rows(ray.get(worker.scribble.remote(keys, "train")), want, list(want.keys()))  # a private copy was read
    meta, named = ray.get(worker.bridge.remote(keys, "train"))
    assert named == keys and "old_log_probs" in meta.field_names
    written = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["old_log_probs"])["old_log_probs"]
    assert torch.equal(written, torch.stack([r.float().sum() for r in want["responses"].unbind()]))
    listed = tq.kv_list("train")["train"]
    assert listed == {k: {"uid": k, **t} for k, t in zip(keys, tags, strict=True)}  # merged, not replaced
    assert ray.get(worker.call.remote("kv_list", "train")) == {"train": listed}


def test_multimodal_inputs_put_from_another_node_are_deduped_where_the_partition_lives(nodes: Any) -> None:
    """``persisting.dedup`` (default auto) on several nodes: B's put runs in A's KV host, which stores each
    prompt's image once; A and B read every response's exact image back."""
    from persisting.compat import _engine

    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    g = torch.Generator().manual_seed(seed)
    images = [torch.rand((128, 64), generator=g) for _ in range(3)]  # 32 KiB each, one per prompt
    keys = [f"mm{p}_{r}_0" for p in range(3) for r in range(4)]
    mm = tensordict.TensorDict(
        {
            "multi_modal_inputs": tensordict.NonTensorStack(
                *({"pixel_values": images[i // 4].clone()} for i in range(12))
            )
        },
        batch_size=[12],
    )
    scores = tensordict.TensorDict({"scores": torch.arange(12.0)}, batch_size=[12])
    tq.kv_batch_put(keys=keys, partition_id="mm", fields=scores, tags=[{} for _ in keys])  # A claims it
    worker = RolloutActor.options(**on("node_b")).remote()
    ray.get(worker.call.remote("kv_batch_put", keys=keys, partition_id="mm", fields=mm))
    for got in (
        tq.kv_batch_get(keys=keys, partition_id="mm"),
        ray.get(worker.call.remote("kv_batch_get", keys=keys, partition_id="mm")),
    ):
        values = got.get("multi_modal_inputs").tolist()
        assert all(torch.equal(v["pixel_values"], images[i // 4]) for i, v in enumerate(values))
        assert torch.equal(got["scores"], torch.arange(12.0))
    store = tq.interface._plane.store
    key, _node = _engine.run(store._route("mm", False))
    fields = _engine.run(_engine.run(store._local_store(key)).data.stats())["fields"]
    assert "multi_modal_inputs@payload" in fields  # stored once per prompt, referenced per response


def test_kv_list_and_kv_clear_across_nodes(nodes: Any) -> None:
    worker = RolloutActor.options(**on("node_b")).remote()
    keys = ["v0", "v1", "v2"]
    ray.get(worker.call.remote("kv_batch_put", keys=keys, partition_id="val", fields=trajectories(keys, 7)))
    assert owner_of("val") == nodes["b"]  # the worker's first put claimed it for B
    got = tq.kv_batch_get(keys=keys, partition_id="val", select_fields=["responses", "messages"])  # A reads B's
    same_rows(got, trajectories(keys, 7), ["responses", "messages"])
    tq.kv_put(key="v1", partition_id="val", tag={"seen": True})  # a tag-only write from A, on B
    everything = tq.kv_list()
    assert {"train", "val"} <= set(everything) and everything["val"] == {"v0": {}, "v1": {"seen": True}, "v2": {}}
    tq.kv_clear(keys=["v0", "v1"], partition_id="val")  # from A, on B's partition
    tq.kv_clear(keys=["v0", "v1"], partition_id="val")  # idempotent
    assert ray.get(worker.call.remote("kv_list", "val")) == {"val": {"v2": {}}}
    with pytest.raises(ValueError, match="not found"):
        tq.kv_batch_get(keys=["v0"], partition_id="val")  # the error of one node, across nodes
    with pytest.raises(ValueError, match="not found"):
        tq.kv_batch_get(keys=["k"], partition_id="nobody-owns-this")
    assert tq.kv_list("nobody-owns-this") == {}
    ray.get(worker.call.remote("kv_batch_put", keys=["v0"], partition_id="val", tags=[{"again": 1}]))
    assert tq.kv_list("val")["val"]["v0"] == {"again": 1}  # re-created: a fresh tag
    with pytest.raises(NotImplementedError, match="several nodes"):
        tq.save_checkpoint(nodes["root"] / "ckpt")  # not gathered across nodes: refused, nothing half written
    assert not (nodes["root"] / "ckpt").exists()


@ray.remote(num_cpus=0)
def keyed_put_on_b(topic: str, partition: str) -> str:
    """The engine's key index through persisting.ray from node B: the put claims ``partition`` for B."""
    batch = tensordict.TensorDict({"x": torch.arange(6.0).reshape(2, 3)}, batch_size=[2])
    with pray.SyncQueue(topic, num_buckets=1) as q:
        q.kv_put(["a", "b"], batch, partition_id=partition, tags=[{"t": 1}, {"t": 2}])
    return str(ray.get_runtime_context().get_node_id())


def test_persisting_ray_forwards_the_key_index_to_the_owner(nodes: Any) -> None:
    assert ray.get(keyed_put_on_b.options(**on("node_b")).remote("keyed", "p")) == nodes["b"]
    with pray.SyncQueue("keyed", num_buckets=1) as q:  # on A: every call below runs on B's broker
        assert q.kv_list("p") == {"p": {"a": {"t": 1}, "b": {"t": 2}}}
        data, meta = q.kv_get(["b", "a"], partition_id="p", fields=["x"])
        assert data["x"].tolist() == [[3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]
        assert q.kv_names(meta.global_indexes, partition_id="p") == ["b", "a"]
        q.kv_put(["a"], partition_id="p", tags=[{"seen": True}])  # a tag-only write from A, on B
        assert q.kv_clear(["b"], partition_id="p") == 1
        assert q.kv_list("p") == {"p": {"a": {"t": 1, "seen": True}}}


def _acked(acks: Path) -> int:
    return len(acks.read_text().split()) if acks.exists() else 0


def _wait_acks(acks: Path, count: int, stream: Any, timeout_s: float = 60.0) -> None:
    """Until ``count`` puts were acknowledged (a worker's start takes seconds on a loaded machine); the stream's
    error if it ended first."""
    deadline = time.monotonic() + timeout_s
    while _acked(acks) < count:
        if ray.wait([stream], timeout=0)[0]:
            ray.get(stream)  # its error, if it failed
            raise AssertionError(f"the stream ended after {_acked(acks)} puts, before {count}")
        assert time.monotonic() < deadline, f"{_acked(acks)} of {count} puts acknowledged after {timeout_s} s"
        time.sleep(0.02)


def _check_acknowledged(partition: str, acks: Path) -> int:
    done = sorted({int(line) for line in acks.read_text().split()})
    assert done, "nothing was acknowledged before the kill: the kill came too early"
    keys = [f"w{i}" for i in done]
    got = tq.kv_batch_get(keys=keys, partition_id=partition)
    for row, i in enumerate(done):
        want = sample(i)
        assert torch.equal(got["responses"][row], want["responses"][0]), i
        assert float(got["rewards"][row]) == float(i)
        assert got["extra"][row] == {"turns": [{"role": "assistant", "n": i}]}
    tags = tq.kv_list(partition)[partition]
    assert all(tags[k] == {"i": i} for k, i in zip(keys, done, strict=True))
    return len(done)


def test_kill_9_of_a_worker_loses_nothing_it_was_acknowledged(nodes: Any, tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    delay_s = random.Random(seed).uniform(0.1, 0.8)
    print(f"seed={seed} kill after {delay_s:.2f} s")
    tq.kv_batch_put(keys=["first"], partition_id="kill-worker", tags=[{}])  # A owns it: B's puts cross nodes
    worker = RolloutActor.options(**on("node_b"), max_restarts=0).remote()
    _, pid, _ = ray.get(worker.where.remote())
    acks = tmp_path / "acks"
    stream = worker.put_stream.remote("kill-worker", 10_000, str(acks))
    _wait_acks(acks, 1, stream)
    time.sleep(delay_s)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(stream, timeout=60)
    assert owner_of("kill-worker") == nodes["a"]
    _check_acknowledged("kill-worker", acks)


def test_kill_9_of_node_b_broker_loses_nothing_acknowledged(nodes: Any, tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    delay_s = random.Random(seed).uniform(0.1, 0.8)
    print(f"seed={seed} kill after {delay_s:.2f} s")
    node_b = nodes["b"]
    actor, key = pray.node_actor(node_b), pray.node_key(node_b)
    before = ray.get(actor.restarts.remote(key))
    worker = RolloutActor.options(**on("node_b")).remote()
    acks, stop = tmp_path / "acks", tmp_path / "stop"
    stream = worker.put_stream.remote("kill-broker", 10**6, str(acks), 0.0, str(stop))  # B owns it: over ipc
    _wait_acks(acks, 1, stream)
    time.sleep(delay_s)
    os.kill(ray.get(actor.broker_pid.remote(key)), signal.SIGKILL)
    _wait_acks(acks, _acked(acks) + 20, stream)  # the worker goes on once the broker is back
    stop.touch()
    n = ray.get(stream, timeout=120)
    assert owner_of("kill-broker") == node_b
    assert ray.get(actor.restarts.remote(key)) == before + 1
    assert _check_acknowledged("kill-broker", acks) == n  # read from A, through B's host


def test_kill_9_of_the_owner_nodes_kv_host_is_survived(nodes: Any, tmp_path: Path) -> None:
    """The host serving B's calls on A's partition dies mid-stream: Ray restarts it on A, the worker's call is made
    again there, and the stream goes on with nothing acknowledged lost."""
    seed = random.randrange(1 << 30)
    delay_s = random.Random(seed).uniform(0.1, 0.8)
    print(f"seed={seed} kill after {delay_s:.2f} s")
    tq.kv_batch_put(keys=["first"], partition_id="kill-host", tags=[{}])  # A owns it: B's puts run in A's host
    worker = RolloutActor.options(**on("node_b")).remote()
    acks = tmp_path / "acks"
    stop = tmp_path / "stop"
    stream = worker.put_stream.remote("kill-host", 10**6, str(acks), 0.0, str(stop))  # back to back: a call is
    _wait_acks(acks, 1, stream)
    time.sleep(delay_s)  # in flight at the kill
    directory = ray.get_actor(ray_hosts.DIRECTORY_NAME, namespace=ray_hosts.NAMESPACE)
    host = ray.get(directory.host.remote(nodes["a"]))[0]  # A's host (made by B's first call if not before)
    pid = ray.get(host.pid.remote())
    os.kill(pid, signal.SIGKILL)
    _wait_acks(acks, _acked(acks) + 20, stream)  # the stream goes on past the kill
    stop.touch()
    n = ray.get(stream, timeout=120)
    assert ray.get(host.pid.remote()) != pid  # Ray restarted it
    assert _check_acknowledged("kill-host", acks) == n
