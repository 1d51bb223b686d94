"""One verl step's trajectories, as verl 0.9.1's agent loop makes them (jagged int64 prompts, responses, input_ids,
response_mask and float32 rm_scores, a NonTensorStack of dicts, verl's tags): the data of ``python -m bench verl``
and ``python -m bench verl-nodes``. torch and tensordict are imported when called."""

from __future__ import annotations

from typing import Any

PROMPT_TOKENS = (128, 512)  # a prompt's length: at least, below
RESPONSE_TOKENS = (256, 1024)
VOCABULARY = 150_000


def trajectories(worker: int, step: int, prompts: int, n: int, seed: int) -> tuple[list[str], Any, list[Any]]:
    """``prompts`` x ``n`` trajectories of ``worker`` at ``step``: their keys, a TensorDict, their tags."""
    import torch
    from tensordict import NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + worker)
    keys: list[str] = []
    tags: list[Any] = []
    extra: list[Any] = []
    cols: dict[str, list[Any]] = {c: [] for c in ("prompts", "responses", "input_ids", "response_mask", "rm_scores")}
    for p in range(prompts):
        plen = int(torch.randint(*PROMPT_TOKENS, (1,), generator=g))
        prompt = torch.randint(0, VOCABULARY, (plen,), generator=g)
        for s in range(n):
            rlen = int(torch.randint(*RESPONSE_TOKENS, (1,), generator=g))
            resp = torch.randint(0, VOCABULARY, (rlen,), generator=g)
            keys.append(f"w{worker}s{step}p{p}_{s}_0")
            cols["prompts"].append(prompt)
            cols["responses"].append(resp)
            cols["input_ids"].append(torch.cat([prompt, resp]))
            cols["response_mask"].append(torch.ones(rlen, dtype=torch.int64))
            score = torch.zeros(rlen)
            score[-1] = float(s % 2)
            cols["rm_scores"].append(score)
            extra.append({"reward_extra_info": {"acc": float(s % 2)}, "turns": 1, "min_global_steps": step})
            tags.append({"status": "success", "prompt_len": plen, "response_len": rlen, "global_steps": step})
    fields = {k: torch.nested.as_nested_tensor(v, layout=torch.jagged) for k, v in cols.items()}
    td = TensorDict({**fields, "extra_fields": NonTensorStack(*extra)}, batch_size=[len(keys)])
    return keys, td, tags
