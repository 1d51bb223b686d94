"""A process of a verl-shaped run on persisting's TransferQueue layer, for ``tests/test_tq_crash.py``.

    python -m tests.tq_crash_worker trainer STORAGE SEED   # init(conf): starts the broker, then trains
    python -m tests.tq_crash_worker rollout STORAGE SEED NAME  # attaches, writes trajectories and tags
    python -m tests.tq_crash_worker verify STORAGE          # a restarted run: init(conf), prints what it finds

Every write prints ``{"begin": ...}`` before the call and ``{"ack": ...}`` once it returned (flushed at once),
so the test knows what was acknowledged and what was in flight when the process was killed.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import torch


def say(**line: Any) -> None:
    print(json.dumps(line), flush=True)


MULTIMODAL = os.environ.get("TQ_CRASH_MULTIMODAL") == "1"  # trajectories carry a 512 KiB image per group


def conf(storage: str) -> dict[str, Any]:
    return {"persisting": {"storage_path": storage, "arena_bytes": 64 << 20}}  # dedup: "auto", the default


def rollout(tq: Any, name: str, rng: random.Random) -> None:
    from tensordict import NonTensorStack

    from .tq_shapes import trajectories

    for i in range(100_000):
        uid = f"{name}x{i}"
        op = {"tags": {uid: {"is_prompt": True, "status": "running", "global_steps": 1}}}
        say(begin=op)
        tq.kv_put(key=uid, partition_id="train", tag=op["tags"][uid])
        say(ack=op)
        keys, td, tags = trajectories([uid], 2, seed=rng.randrange(1 << 30))
        sums = {k: int(r.sum()) for k, r in zip(keys, td["responses"].unbind(), strict=True)}
        op = {"tags": dict(zip(keys, tags, strict=True)), "responses": sums}
        if MULTIMODAL:  # the group's one image in each response's multi_modal_inputs (deduped: stored once)
            pixels = torch.randint(0, 1000, (64, 1024), generator=torch.Generator().manual_seed(i))
            td["multi_modal_inputs"] = NonTensorStack(*[{"pixel_values": pixels.clone()} for _ in keys])
            op["pixels"] = {k: int(pixels.sum()) for k in keys}
        say(begin=op)
        tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=tags)
        say(ack=op)
        op = {"tags": {uid: {"status": "finished"}}}
        say(begin=op)
        tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})
        say(ack=op)


def train(tq: Any, rng: random.Random) -> None:
    from tensordict import TensorDict

    step = 0
    while True:
        listed = tq.kv_list("train").get("train", {})
        todo = [k for k, t in listed.items() if not t.get("is_prompt") and "trained" not in t][:8]
        if not todo:
            time.sleep(0.05)
            continue
        step += 1
        data = tq.kv_batch_get(keys=todo, partition_id="train", select_fields=["responses"])
        parts = [(-0.5 * r.float()) for r in data["responses"].unbind()]
        lp = torch.nested.as_nested_tensor(parts, layout=torch.jagged)
        op = {
            "tags": {k: {"trained": step} for k in todo},
            "old_log_probs": {k: round(float(p.sum()), 3) for k, p in zip(todo, parts, strict=True)},
        }
        say(begin=op)
        fields = TensorDict({"old_log_probs": lp}, batch_size=[len(todo)])
        tq.kv_batch_put(keys=todo, partition_id="train", fields=fields, tags=[{"trained": step} for _ in todo])
        say(ack=op)


def verify(tq: Any) -> None:
    listed = tq.kv_list("train").get("train", {})
    # trajectories by their key ({uid}_{session}_0): a prompt whose tag was in flight at the kill has none yet
    traj = [k for k in listed if k.endswith("_0") and k.count("_") == 2]
    responses: dict[str, int] = {}
    lps: dict[str, float] = {}
    if traj:
        data = tq.kv_batch_get(keys=traj, partition_id="train", select_fields=["responses"])
        responses = {k: int(r.sum()) for k, r in zip(traj, data["responses"].unbind(), strict=True)}
        trained = [k for k in traj if "trained" in listed[k]]
        if trained:
            got = tq.kv_batch_get(keys=trained, partition_id="train", select_fields=["old_log_probs"])
            lps = {k: round(float(p.sum()), 3) for k, p in zip(trained, got["old_log_probs"].unbind(), strict=True)}
    pixels: dict[str, int] = {}
    if traj and MULTIMODAL:
        mm = tq.kv_batch_get(keys=traj, partition_id="train", select_fields=["multi_modal_inputs"])
        values = mm.get("multi_modal_inputs").tolist()
        pixels = {k: int(v["pixel_values"].sum()) for k, v in zip(traj, values, strict=True)}
    say(tags=listed, responses=responses, old_log_probs=lps, pixels=pixels)


def main() -> None:
    role, storage = sys.argv[1], sys.argv[2]
    import persisting.compat.transfer_queue as tq

    if role == "verify":
        tq.init(conf(storage))
        try:
            verify(tq)
        finally:
            tq.close()
        return
    rng = random.Random(int(sys.argv[3]))
    tq.init(conf(storage))
    say(ready=role)
    if role == "trainer":
        train(tq, rng)
    else:
        rollout(tq, sys.argv[4], rng)


if __name__ == "__main__":
    main()
