"""The scenarios that drive verl 0.9.1's own code (see ``tests/tq_scenarios.py``): its trainer's checkpoint
re-issue, ``ReplayBuffer`` (sync, DAPO filter), ``ReplayBufferAsync`` and a ``RayWorkerGroup`` bridge."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from tests.tq_shapes import attempt, canon, rollout

VERL_SCENARIOS: dict[str, Callable[[Any], Any]] = {}


def scenario(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    VERL_SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def checkpoint(tq: Any) -> Any:
    import shutil
    import tempfile

    r: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="tqck-"))
    try:
        rollout(tq, ["c1", "c2"], 2, seed=3)
        tq.kv_batch_put(keys=["c3"], partition_id="train", tags=[{"is_prompt": True, "status": "running",
                                                                    "global_steps": 2}])  # fmt: skip
        ck = root / "global_step_2" / "transfer_queue"
        tq.save_checkpoint(ck, metadata={"global_steps": 2})
        r["metadata_json"] = json.loads((ck / "metadata.json").read_text())
        r["no_tmp_left"] = sorted(p.name for p in ck.parent.iterdir())
        tq.save_checkpoint(ck, metadata={"global_steps": 2, "again": True})  # replaces atomically
        r["metadata_again"] = json.loads((ck / "metadata.json").read_text())
        tq.kv_clear(keys=["c1", "c1_0_0"], partition_id="train")
        tq.kv_put(key="late", partition_id="train", tag={"x": 1})
        tq.load_checkpoint(ck)
        r["restored_list"] = tq.kv_list()
        r["restored_data"] = attempt(lambda: tq.kv_batch_get(keys=["c1_0_0", "c2_1_0"], partition_id="train"))
        r["err_missing_dir"] = attempt(lambda: tq.load_checkpoint(root / "missing")).get("error")
        # verl's resume path: re-issue the in-flight prompts the checkpoint holds (PPOTrainer's own method).
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        issued: list[Any] = []
        fake = SimpleNamespace(
            trainer_mode="async", global_steps=5,
            agent_loop_manager=SimpleNamespace(generate_sequences=lambda batch: issued.append(canon(batch))),
        )  # fmt: skip
        tq.kv_batch_put(keys=["c3"], partition_id="train", fields=tq.kv_batch_get(keys=["c1"], partition_id="train"))
        r["reissued"] = PPOTrainer._reissue_inflight_prompts(fake, "train")
        r["reissued_batches"] = issued
        r["after_reissue"] = tq.kv_list("train")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return r


def _replay_buffer(mode: str, **kw: Any) -> Any:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    cls = ReplayBuffer if mode == "sync" else ReplayBufferAsync
    args = dict(max_off_policy_threshold=None, max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create({}))
    args.update(kw)
    return cls(trainer_mode=mode, trainer_config=OmegaConf.create({}), poll_interval=0.01, **args)


def _train_step(tq: Any, batch: Any) -> Any:
    """The trainer's per-step data path: read columns, write log-probs/values back per column, read, clear."""
    from tensordict import TensorDict

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses", "input_ids"])
    lp = torch.nested.as_nested_tensor([-0.01 * r.float() for r in data["responses"].unbind()], layout=torch.jagged)
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                    fields=TensorDict({"old_log_probs": lp}, batch_size=[len(batch.keys)]))  # fmt: skip
    vals = TensorDict({"values": torch.arange(len(batch.keys), dtype=torch.float32)}, batch_size=[len(batch.keys)])
    put = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=vals)
    out = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                          select_fields=["old_log_probs", "values", "rm_scores"])  # fmt: skip
    tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)
    return {"put": canon(put), "out": canon(out), "offsets": data["input_ids"].offsets().tolist()}


@scenario
def replay_sync(tq: Any) -> Any:
    rollout(tq, ["s1", "s2", "s3"], 2, seed=4)
    rb = _replay_buffer("sync")
    batch, metrics = rb.sample(global_steps=1, partition_id="train", batch_size=2)
    return {"batch": canon(batch), "metrics": canon(metrics), "step": _train_step(tq, batch), "left": tq.kv_list()}


@scenario
def replay_dapo(tq: Any) -> Any:
    refills: list[int] = []

    def refill(k: int) -> None:  # the trainer's refill: k fresh prompts, rolled out at once here
        refills.append(k)
        rollout(tq, [f"f{len(refills)}x{i}" for i in range(k)], 2, seed=10 + len(refills), reward=lambda u, s: float(s))

    # g1: identical rewards (no signal) -> evicted, 2 prompts refilled (sync DAPO: 2k); g2, g3: rewards differ
    rollout(tq, ["g1"], 2, seed=5, reward=lambda u, s: 1.0)
    rollout(tq, ["g2", "g3"], 2, seed=6, reward=lambda u, s: float(s))
    rb = _replay_buffer("sync", filter_groups_metric="reward", refill_fn=refill, train_batch_size=3, gen_batch_size=1)
    batch, metrics = rb.sample(global_steps=1, partition_id="train", batch_size=3)
    return {"batch": canon(batch), "metrics": canon(metrics), "refills": refills, "left": tq.kv_list()}


@scenario
def replay_async(tq: Any) -> Any:
    refills: list[int] = []
    rollout(tq, ["o1"], 2, seed=7, global_steps=1)  # stale at step 4 with threshold 2
    rollout(tq, ["o2", "o3"], 2, seed=8, global_steps=3)
    rollout(tq, ["o4"], 2, seed=9, global_steps=3, status="failure")
    rb = _replay_buffer("async", max_off_policy_threshold=2, refill_fn=refills.append)
    batch, metrics = rb.sample(global_steps=4, partition_id="train", batch_size=2)
    return {"batch": canon(batch), "metrics": canon(metrics), "refills": refills, "step": _train_step(tq, batch),
            "left": tq.kv_list()}  # fmt: skip


@scenario
def worker_group(tq: Any) -> Any:
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    keys = rollout(tq, ["w1", "w2"], 2, seed=11)
    batch = tq.KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train", fields=["responses"])
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    worker_cls = ray.remote(_score_worker())
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=worker_cls))
    try:
        out = wg.compute_log_prob(batch)
        got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["old_log_probs", "rank"])
        return {"out": canon(out), "got": canon(got), "tags": tq.kv_list("train")}
    finally:
        for worker in wg.workers:
            ray.kill(worker)


def _score_worker() -> type:
    from tensordict import TensorDict
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register

    class _ScoreWorker(Worker):
        def __init__(self) -> None:
            super().__init__()
            self._register_dispatch_collect_info("actor", dp_rank=self.rank, is_collect=True)

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
        def compute_log_prob(self, data: Any) -> Any:
            responses = data["responses"]
            lp = torch.nested.as_nested_tensor([-0.5 * r.float() for r in responses.unbind()], layout=torch.jagged)
            n = data.batch_size[0]
            return TensorDict({"old_log_probs": lp, "rank": torch.full((n,), self.rank)}, batch_size=[n])

    return _ScoreWorker
