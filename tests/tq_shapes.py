"""What the TransferQueue scenarios put and how they report it: verl-shaped trajectories, and plain JSON of any
result (tensors with their layout, offsets and dtype; errors as their type and message)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
