"""A process of a verl multimodal GRPO step on persisting's TransferQueue layer, for ``tests/test_tq_dedup.py``.

    python -m tests.tq_dedup_worker rollout SEED   # attaches (init()), kv_batch_puts the step's trajectories
    python -m tests.tq_dedup_worker read SEED CKPT # attaches, reads them back, partial write, clear, checkpoint

The step: ``PROMPTS`` prompts x ``RESPONSES`` responses, each response's ``multi_modal_inputs`` a dict holding its
prompt's ``pixel_values`` (~1 MiB, a clone per response: equal values, not one object) and ``image_grid_thw``,
a dense per-prompt image column repeated per response, a dense per-response column of distinct big samples, and
jagged prompts/responses. ``read`` prints one JSON line: a digest of everything it read (the same with dedup on
or off: exact values, layouts, offsets, dtypes) and whether each value equals what the rollout put.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import torch

PROMPTS, RESPONSES = 8, 4
PIXELS = (256, 1024)  # float32: 1 MiB per image
PARTITION = "train"


def step(seed: int) -> tuple[list[str], Any, list[dict[str, Any]]]:
    from tensordict import NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(seed)
    keys, mm, images, distinct, prompts, responses, tags = [], [], [], [], [], [], []
    for p in range(PROMPTS):
        pixels = torch.rand(PIXELS, generator=g)
        grid = torch.tensor([[1, 16 + p, 16]])
        image = torch.rand((16, 64), generator=g)  # 4 KiB per sample: the dense image column
        prompt = torch.randint(0, 1000, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g)
        for r in range(RESPONSES):
            keys.append(f"p{p}_{r}_0")
            mm.append({"pixel_values": pixels.clone(), "image_grid_thw": grid.clone()})
            images.append(image)
            distinct.append(torch.rand(2048, generator=g))  # 8 KiB, distinct per response: stays plain
            prompts.append(prompt)
            responses.append(torch.randint(0, 1000, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g))
            tags.append({"status": "success", "prompt": p, "response": r})
    td = TensorDict(
        {
            "multi_modal_inputs": NonTensorStack(*mm),
            "image": torch.stack(images),
            "old_values": torch.stack(distinct),
            "prompts": torch.nested.as_nested_tensor(prompts, layout=torch.jagged),
            "responses": torch.nested.as_nested_tensor(responses, layout=torch.jagged),
        },
        batch_size=[len(keys)],
    )
    return keys, td, tags


def digest(x: Any, h: Any) -> None:
    """Everything a caller can see of ``x`` (types, layouts, offsets, dtypes, shapes, bytes) into ``h``."""
    from tensordict import NonTensorStack, TensorDictBase

    if isinstance(x, NonTensorStack):
        h.update(b"nts")
        for v in x.tolist():
            digest(v, h)
    elif isinstance(x, TensorDictBase):
        h.update(repr((type(x).__name__, list(x.batch_size), sorted(x.keys()))).encode())
        for k in sorted(x.keys()):
            digest(x.get(k), h)
    elif isinstance(x, torch.Tensor):
        if x.is_nested:
            h.update(repr(("nested", str(x.layout), str(x.dtype))).encode())
            if x.layout == torch.jagged:
                h.update(x.offsets().numpy().tobytes())
                x = x.values()
            else:
                for t in x.unbind():
                    digest(t, h)
                return
        h.update(repr(("tensor", str(x.dtype), tuple(x.shape))).encode())
        h.update(x.contiguous().view(torch.uint8).numpy().tobytes())
    elif isinstance(x, dict):
        h.update(repr(("dict", sorted(x))).encode())
        for k in sorted(x):
            digest(x[k], h)
    else:
        h.update(repr((type(x).__name__, x)).encode())


def same(got: Any, put: Any, keys: list[str]) -> dict[str, bool]:
    """Whether each field read back holds, sample by sample, what was put."""
    out = {}
    for name in put.keys():  # noqa: SIM118 (a TensorDict's keys, not its batch dimension)
        a, b = got.get(name), put.get(name)
        if name == "multi_modal_inputs":
            ok = all(
                all(torch.equal(x[k], y[k]) for k in ("pixel_values", "image_grid_thw"))
                for x, y in zip(a.tolist(), b.tolist(), strict=True)
            )
        else:
            ok = all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind(), strict=True))
        out[name] = ok and len(keys) == got.batch_size[0]
    return out


def rollout(tq: Any, seed: int) -> None:
    keys, td, tags = step(seed)
    meta = tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=td, tags=tags)
    print(json.dumps({"fields": sorted(meta.fields)}), flush=True)


def read(tq: Any, seed: int, ckpt: str) -> None:
    from tensordict import TensorDict

    keys, td, _tags = step(seed)
    h = hashlib.sha256()
    got = tq.kv_batch_get(keys=keys, partition_id=PARTITION)
    digest(got, h)
    exact = same(got, td, keys)
    part = tq.kv_batch_get(keys=keys[5:13], partition_id=PARTITION, select_fields=["multi_modal_inputs", "prompts"])
    digest(part, h)
    # a partial column write, a tag, a clear: then a checkpoint restores exactly that
    adv = TensorDict({"advantages": torch.arange(len(keys), dtype=torch.float32)}, batch_size=[len(keys)])
    tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=adv, tags=[{"trained": 1} for _ in keys])
    tq.kv_clear(keys=keys[-RESPONSES:], partition_id=PARTITION)
    kept = keys[:-RESPONSES]
    before = tq.kv_batch_get(keys=kept, partition_id=PARTITION)
    listed = tq.kv_list(PARTITION)[PARTITION]
    digest(before, h)
    h.update(json.dumps(listed, sort_keys=True).encode())
    tq.save_checkpoint(ckpt)
    tq.kv_clear(keys=kept, partition_id=PARTITION)
    tq.load_checkpoint(ckpt)
    after = tq.kv_batch_get(keys=kept, partition_id=PARTITION)
    ah = hashlib.sha256()
    digest(after, ah)
    bh = hashlib.sha256()
    digest(before, bh)
    restored = ah.digest() == bh.digest() and tq.kv_list(PARTITION)[PARTITION] == listed
    fields = sorted(tq.get_client().kv_retrieve_meta(kept, PARTITION).field_names)
    print(json.dumps({"digest": h.hexdigest(), "exact": exact, "restored": restored, "fields": fields}), flush=True)


def main() -> None:
    import persisting.compat.transfer_queue as tq

    role, seed = sys.argv[1], int(sys.argv[2])
    tq.init()  # attaches to the broker the test started (its conf: persisting.dedup included)
    try:
        if role == "rollout":
            rollout(tq, seed)
        else:
            read(tq, seed, sys.argv[3])
    finally:
        tq.close()


if __name__ == "__main__":
    main()
