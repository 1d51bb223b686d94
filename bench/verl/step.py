"""The pieces of one verl-shaped step of ``python -m bench verl`` (bench/verl/__init__.py says the step): a
rollout worker process, the trainer's dispatch of the prompts and its training part, on either backend (persisting's
TransferQueue layer or TransferQueue itself, the same calls)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from bench.common.tq_cluster import tq_attach
from bench.common.verl_steps import trajectories


def backend_module(backend: str) -> Any:
    return importlib.import_module("persisting.compat.transfer_queue" if backend == "persisting" else "transfer_queue")


def rollout_worker(backend: str, worker: int, attach: str, prompts: int, n: int, seed: int, inbox: Any,
                    outbox: Any) -> None:  # fmt: skip
    tq = backend_module(backend)
    if backend == "transferqueue":
        tq_attach(attach)
    else:
        tq.init()
    outbox.put(("ready", worker, os.getpid()))
    while True:
        step = inbox.get()
        if step is None:
            break
        keys, td, tags = trajectories(worker, step, prompts, n, seed)  # made before the clock starts
        outbox.put(("made", worker, None))
        if inbox.get() != "go":
            break
        uids = sorted({k.split("_")[0] for k in keys})
        for uid in uids:  # the agent loop: running, the sessions' trajectories, then the terminal status
            tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
        tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=tags)
        for uid in uids:
            tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})
        outbox.put(("done", worker, None))
    if backend == "persisting":
        tq.close()


def dispatch(tq: Any, step: int, workers: int, prompts: int) -> None:
    import torch
    from tensordict import NonTensorStack, TensorDict

    uids = [f"w{w}s{step}p{p}" for w in range(workers) for p in range(prompts)]
    fields = TensorDict(
        {
            "raw_prompt": NonTensorStack(*[[{"role": "user", "content": u}] for u in uids]),
            "index": torch.arange(len(uids)),
        },
        batch_size=[len(uids)],
    )
    tags = [{"is_prompt": True, "status": "pending", "global_steps": step} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", fields=fields, tags=tags)


def train_step(tq: Any, dp: int) -> int:
    import torch
    from tensordict import TensorDict

    listed = tq.kv_list("train").get("train", {})
    keys = [k for k, t in listed.items() if not t.get("is_prompt")]
    prompts = [k for k, t in listed.items() if t.get("is_prompt")]
    shares = [keys[r::dp] for r in range(dp)]
    for share in shares:  # each rank reads its share, computes, writes its columns back one by one
        data = tq.kv_batch_get(keys=share, partition_id="train", select_fields=["input_ids", "responses",
                                                                                 "response_mask"])  # fmt: skip
        lens = [len(r) for r in data["responses"].unbind()]
        for column in ("old_log_probs", "ref_log_prob", "values"):
            parts = [torch.full((m,), -0.5) for m in lens]
            nt = torch.nested.as_nested_tensor(parts, layout=torch.jagged)
            tq.kv_batch_put(keys=share, partition_id="train", fields=TensorDict({column: nt}, batch_size=[len(share)]))
    update = ["old_log_probs", "ref_log_prob", "values", "rm_scores", "response_mask"]
    for share in shares:  # the update reads what it needs
        tq.kv_batch_get(keys=share, partition_id="train", select_fields=update)
    tq.kv_clear(keys=keys + prompts, partition_id="train")
    return len(keys)
