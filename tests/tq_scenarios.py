"""verl-shaped scenarios run against a ``transfer_queue`` module: persisting's layer or the real TransferQueue 0.1.11.

    python -m tests.tq_scenarios --backend persisting|transferqueue --workdir DIR SCENARIO... > result.json

Each scenario drives TransferQueue's API the way verl 0.9.1 does, or verl's own code (its ``ReplayBuffer`` and
``ReplayBufferAsync``, its trainer's in-flight re-issue after ``load_checkpoint``, a ``RayWorkerGroup`` whose
``@register``ed method receives a ``KVBatchMeta``), and returns what it observed as plain JSON (tensors as lists
with their layout, offsets and dtype; errors as their type and message). The differential test runs both backends
in separate processes (both define ``transfer_queue``) and compares the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

SCENARIOS: dict[str, Callable[[Any], Any]] = {}
RAY_CPUS = 6  # logical: TransferQueue's controller and storage unit take one each, the worker group two
ARENA_BYTES = 64 << 20
SCENARIO_TIMEOUT_S = 120


def scenario(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


# -- canonical JSON of what a call returned ---------------------------------------------------------------
def canon(x: Any) -> Any:
    from tensordict import NonTensorData, NonTensorStack, TensorDictBase

    if isinstance(x, NonTensorStack):  # before TensorDictBase: a NonTensorStack is one
        return {"nts": [canon(v) for v in x.tolist()]}
    if isinstance(x, NonTensorData):
        return {"ntd": canon(x.data)}
    if isinstance(x, TensorDictBase):
        return {"td": {k: canon(x.get(k)) for k in sorted(x.keys())}, "batch": list(x.batch_size)}
    if isinstance(x, torch.Tensor):
        if x.is_nested:
            if x.layout == torch.jagged:
                return {"jagged": x.values().tolist(), "offsets": x.offsets().tolist(), "dtype": str(x.dtype)}
            return {"strided": [t.tolist() for t in x.unbind()], "dtype": str(x.dtype)}
        return {"dense": x.tolist(), "dtype": str(x.dtype)}
    if hasattr(x, "keys") and hasattr(x, "tags") and hasattr(x, "partition_id"):  # KVBatchMeta
        return {
            "keys": list(x.keys), "tags": canon(x.tags), "partition_id": x.partition_id,
            "fields": None if x.fields is None else sorted(x.fields), "extra_info": canon(x.extra_info),
        }  # fmt: skip
    if isinstance(x, dict):
        return {str(k): canon(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set):
        return [canon(v) for v in (sorted(x) if isinstance(x, set) else x)]
    if isinstance(x, float | int | str | bool) or x is None:
        return x
    return repr(x)


def attempt(fn: Callable[[], Any]) -> Any:
    try:
        return {"ok": canon(fn())}
    except Exception as exc:  # the differential test compares the error's type and message
        return {"error": type(exc).__name__, "msg": str(exc)}


# -- verl-shaped data -------------------------------------------------------------------------------------
def trajectories(uids: list[str], n: int, seed: int, reward: Callable[[int, int], float] | None = None) -> Any:
    """n responses per prompt uid as verl's agent loop writes them: jagged prompts/responses/input_ids, a dense
    score per token for rm_scores' last token, NonTensorStack dicts, and the tags it sets."""
    from tensordict import NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(seed)
    keys, prompts, responses, ids, masks, scores, extra, msgs, tags = [], [], [], [], [], [], [], [], []
    for u, uid in enumerate(uids):
        plen = int(torch.randint(3, 9, (1,), generator=g))
        prompt = torch.randint(0, 1000, (plen,), generator=g)
        for s in range(n):
            rlen = int(torch.randint(2, 12, (1,), generator=g))
            resp = torch.randint(0, 1000, (rlen,), generator=g)
            r = reward(u, s) if reward else float(s % 2)
            keys.append(f"{uid}_{s}_0")
            prompts.append(prompt)
            responses.append(resp)
            ids.append(torch.cat([prompt, resp]))
            masks.append(torch.ones(rlen, dtype=torch.int64))
            rm = torch.zeros(rlen)
            rm[-1] = r
            scores.append(rm)
            extra.append(
                {"reward_extra_info": {"acc": r}, "min_global_steps": 1, "max_global_steps": 1, "turns": [1, 2]}
            )
            msgs.append([{"role": "user", "content": f"q{u}"}, {"role": "assistant", "content": f"a{u}.{s}"}])
            tags.append(
                {"status": "success", "prompt_len": plen, "response_len": rlen, "seq_len": plen + rlen,
                 "global_steps": 1, "min_global_steps": 1, "max_global_steps": 1}
            )  # fmt: skip

    def jag(ts: list[Any]) -> Any:
        return torch.nested.as_nested_tensor(ts, layout=torch.jagged)

    td = TensorDict(
        {
            "prompts": jag(prompts), "responses": jag(responses), "input_ids": jag(ids),
            "response_mask": jag(masks), "rm_scores": jag(scores),
            "extra_fields": NonTensorStack(*extra), "raw_prompt": NonTensorStack(*msgs),
        },
        batch_size=[len(keys)],
    )  # fmt: skip
    return keys, td, tags


def rollout(tq: Any, uids: list[str], n: int, seed: int, partition: str = "train", status: str = "finished",
            reward: Callable[[int, int], float] | None = None, global_steps: int = 1) -> list[str]:  # fmt: skip
    """What verl's trainer and agent loop write for a batch of prompts: the prompt (pending, then running), each
    session's trajectories with their tags, then the prompt's terminal status."""
    from tensordict import NonTensorStack, TensorDict

    prompt_fields = TensorDict(
        {"raw_prompt": NonTensorStack(*[[{"role": "user", "content": u}] for u in uids]),
         "index": torch.arange(len(uids))},
        batch_size=[len(uids)],
    )  # fmt: skip
    tags = [{"is_prompt": True, "status": "pending", "global_steps": global_steps} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id=partition, fields=prompt_fields, tags=tags)
    for uid in uids:
        tq.kv_put(key=uid, partition_id=partition, tag={"status": "running"})
    keys, td, ttags = trajectories(uids, n, seed, reward)
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=td, tags=ttags)
    for uid in uids:
        tq.kv_put(key=uid, partition_id=partition, tag={"status": status})
    return keys


# -- scenarios --------------------------------------------------------------------------------------------
@scenario
def semantics(tq: Any) -> Any:
    from tensordict import NonTensorStack, TensorDict

    r: dict[str, Any] = {}
    r["tag_only"] = attempt(lambda: tq.kv_put(key="p0", partition_id="train", tag={"status": "pending", "n": 1}))
    r["tags_merged"] = attempt(lambda: tq.kv_put(key="p0", partition_id="train", tag={"status": "running"}))
    keys, td, tags = trajectories(["u1", "u2"], 2, seed=1)
    put = tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=tags)
    put.extra_info["mine"] = 1  # verl assigns into it
    r["batch_put"] = canon(put)
    lp = TensorDict(
        {
            "old_log_probs": torch.nested.as_nested_tensor(
                [torch.full((len(t),), -0.5) for t in td["responses"].unbind()], layout=torch.jagged
            )
        },
        batch_size=[4],
    )
    r["fields_no_tags"] = attempt(lambda: tq.kv_batch_put(keys=keys, partition_id="train", fields=lp))
    r["tag_kept"] = attempt(lambda: tq.kv_list("train")["train"][keys[0]])
    r["partial_write_keeps_columns"] = attempt(lambda: tq.kv_batch_get(keys=keys, partition_id="train"))
    r["key_order"] = attempt(
        lambda: tq.kv_batch_get(keys=keys[::-1], partition_id="train", select_fields=["responses", "extra_fields"])
    )
    one = TensorDict({"vpred": torch.ones(1, 3)}, batch_size=[1])
    tq.kv_batch_put(keys=keys[:1], partition_id="train", fields=one)
    r["common_columns_only"] = attempt(lambda: sorted(tq.kv_batch_get(keys=keys[:2], partition_id="train").keys()))
    r["select_dropped"] = attempt(
        lambda: tq.kv_batch_get(keys=keys[:2], partition_id="train", select_fields=["vpred", "rm_scores"])
    )
    r["select_str"] = attempt(lambda: tq.kv_batch_get(keys=keys[0], partition_id="train", select_fields="vpred"))
    r["missing_key_left_out"] = attempt(lambda: tq.kv_batch_get(keys=[keys[1], "nope"], partition_id="train"))
    r["err_no_key"] = attempt(lambda: tq.kv_batch_get(keys=["nope"], partition_id="train"))
    r["err_no_partition"] = attempt(lambda: tq.kv_batch_get(keys=keys, partition_id="nowhere"))
    r["err_no_shared_column"] = attempt(lambda: tq.kv_batch_get(keys=["p0", keys[0]], partition_id="train"))
    r["err_select_none"] = attempt(lambda: tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["zz"]))
    r["err_put_nothing"] = attempt(lambda: tq.kv_batch_put(keys=["a"], partition_id="train"))
    r["err_put_tags_len"] = attempt(lambda: tq.kv_batch_put(keys=["a", "b"], partition_id="train", tags=[{}]))
    r["err_put_rows"] = attempt(lambda: tq.kv_batch_put(keys=["a"], partition_id="train", fields=one.expand(2)))
    r["kv_list_all"] = attempt(lambda: tq.kv_list())
    r["kv_list_unknown"] = attempt(lambda: tq.kv_list("nowhere"))
    tq.kv_clear(keys=[keys[0]], partition_id="train")
    r["clear_again"] = attempt(lambda: tq.kv_clear(keys=[keys[0], "never"], partition_id="train"))
    r["clear_str"] = attempt(lambda: tq.kv_clear(keys=keys[1], partition_id="train"))
    r["cleared_get"] = attempt(lambda: tq.kv_batch_get(keys=[keys[0]], partition_id="train"))
    r["recreated"] = attempt(lambda: tq.kv_put(key=keys[0], partition_id="train", fields={"x": torch.tensor([7, 8])}))
    r["recreated_get"] = attempt(lambda: tq.kv_batch_get(keys=[keys[0]], partition_id="train"))
    dense = TensorDict({"ids": torch.arange(8).reshape(2, 4), "score": torch.tensor([0.5, 1.5]),
                        "mm": NonTensorStack({"pixel": torch.ones(2, 2)}, {"pixel": torch.zeros(1, 2)})},
                       batch_size=[2])  # fmt: skip
    tq.kv_batch_put(keys=["d0", "d1"], partition_id="val", fields=dense)
    got = tq.kv_batch_get(keys=["d0", "d1"], partition_id="val")
    r["dense_comes_back_jagged"] = canon(got)
    r["padded"] = got["ids"].to_padded_tensor(0).tolist()
    r["kv_list_after"] = attempt(lambda: tq.kv_list())

    async def run_async() -> Any:
        m = await tq.async_kv_batch_put(keys=["a0"], partition_id="val", fields=dense[:1], tags=[{"t": 1}])
        await tq.async_kv_put(key="a0", partition_id="val", tag={"t": 2, "u": 3})
        listed = await tq.async_kv_list("val")
        data = await tq.async_kv_batch_get(keys=["a0", "d1"], partition_id="val", select_fields=["ids"])
        await tq.async_kv_clear(keys=["a0"], partition_id="val")
        return [canon(m), listed, canon(data), await tq.async_kv_list("val")]

    r["async"] = attempt(lambda: asyncio.run(run_async()))
    client = tq.get_client()
    meta = client.kv_retrieve_meta(keys=["d1", "d0", "nope"], partition_id="val", create=False)
    r["retrieve_meta"] = {
        "size": meta.size,
        "fields": meta.field_names,
        "tags": meta.custom_meta,
        "ready": meta.is_ready,
    }
    r["retrieve_keys"] = client.kv_retrieve_keys(global_indexes=meta.global_indexes, partition_id="val")
    r["client_get_data"] = canon(client.get_data(meta.select_fields(["score", "ids"])))
    return r


@scenario
def batchmeta(tq: Any) -> Any:
    import pickle

    r: dict[str, Any] = {}
    # verl's bridge returns BatchMeta() for ranks that collect nothing; TransferQueue 0.1.11's needs two arguments
    r["no_arg"] = attempt(lambda: [tq.BatchMeta().size, tq.BatchMeta().field_names, tq.BatchMeta().is_ready])
    empty = tq.BatchMeta.empty()
    r["empty"] = [empty.size, empty.field_names, empty.is_ready, empty.extra_info]
    empty.extra_info = {"k": 1}
    r["extra_assign"] = empty.extra_info
    kv = tq.KVBatchMeta(keys=["a", "b", "c"], tags=[{"x": i} for i in range(3)], partition_id="train", fields=["f"])
    r["kv_chunk"] = [canon(c) for c in kv.chunk(chunks=2)]
    r["kv_concat"] = canon(tq.KVBatchMeta.concat(kv.chunk(chunks=3)))
    r["kv_pickle"] = canon(pickle.loads(pickle.dumps(kv)))
    r["kv_dup"] = attempt(lambda: tq.KVBatchMeta(keys=["a", "a"], tags=[{}, {}]))
    kv.reorder([2, 0, 1])
    r["kv_reorder"] = canon(kv)
    r["kv_select"] = canon(kv.select_keys(["c", "a"]))
    import dataclasses

    r["kv_is_dataclass"] = dataclasses.is_dataclass(tq.KVBatchMeta)
    keys, td, tags = trajectories(["b1"], 3, seed=2)
    tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=tags)
    meta = tq.get_client().kv_retrieve_meta(keys=keys, partition_id="train", create=False)
    meta.extra_info["step"] = 3
    parts = meta.chunk(chunks=2)
    r["chunk_sizes"] = [p.size for p in parts]
    back = tq.BatchMeta.concat(parts)
    r["concat"] = [back.size, back.field_names, back.extra_info, back.custom_meta == meta.custom_meta]
    again = pickle.loads(pickle.dumps(back))
    r["pickle"] = [again.size, again.field_names, again.is_ready, again.extra_info]
    r["get_after_pickle"] = canon(tq.get_client().get_data(again.select_fields(["responses"])))
    return r


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


# -- backends ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def backend(name: str, workdir: Path, ray_needed: bool) -> Iterator[Any]:
    import ray

    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent)])}
    if name == "persisting":
        from persisting.compat.transfer_queue import activate

        activate.install()
        shim = workdir / "shim"
        activate.write_shim(shim)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env["PYTHONPATH"]])
        os.environ["XDG_RUNTIME_DIR"] = str(workdir / "run")
    os.environ.update(env)
    started_ray = False
    if ray_needed or name == "transferqueue":
        ray.init(address="local", num_cpus=RAY_CPUS, object_store_memory=300 * 1000**2, include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
        started_ray = True
    try:
        import transfer_queue as tq

        if name == "persisting":
            assert getattr(tq, "BACKEND", None) == "persisting", tq
            tq.init({"persisting": {"storage_path": str(workdir / "data"), "arena_bytes": ARENA_BYTES}})
        else:
            assert getattr(tq, "BACKEND", None) is None, tq
            from omegaconf import OmegaConf

            conf = {"controller": {"polling_mode": True}, "backend": {"SimpleStorage": {"num_data_storage_units": 1}}}
            tq.init(OmegaConf.create(conf, flags={"allow_objects": True}))
        for lname in list(logging.root.manager.loggerDict):
            if lname.startswith(("transfer_queue", "persisting", "verl")):
                logging.getLogger(lname).setLevel(logging.ERROR)
        try:
            yield tq
        finally:
            tq.close()
    finally:
        if started_ray:
            ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["persisting", "transferqueue"], required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    out: dict[str, Any] = {}
    with backend(args.backend, args.workdir, "worker_group" in args.scenarios) as tq:
        for name in args.scenarios:
            for partition, keys in tq.kv_list().items():  # each scenario starts with no key
                if keys:
                    tq.kv_clear(keys=list(keys), partition_id=partition)
            signal.alarm(SCENARIO_TIMEOUT_S)  # verl's samplers poll for ever when a scenario goes wrong
            out[name] = SCENARIOS[name](tq)
            signal.alarm(0)
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
