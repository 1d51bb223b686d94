"""The workload of ``python -m bench verl-dedup``: the TransferQueue layer's dedup (``persisting.dedup``) on a verl GRPO
step, on and off, in the same run.

A step: ``--prompts`` prompts x ``--n`` responses, each response with jagged int64 prompts/responses (prompt 128-511,
response 256-1023 tokens), a NonTensorStack of dicts (verl's ``extra_fields``) and, in the multimodal shape,
``multi_modal_inputs``: a dict per response holding its prompt's ``pixel_values`` (``--image-mib`` MiB of float32; a
clone per response, as a collate leaves equal values in distinct tensors) and ``image_grid_thw``. The text-only shape
has no image: what dedup costs a run that has nothing to dedup. One process (it starts the broker, ``init(conf)``)
``kv_batch_put``s the step, ``kv_batch_get``s it back (every field), and clears it; ``--steps`` steps after a
warm-up, timed from the put to the end of the get. Each (shape, dedup) runs ``--reps`` times in fresh processes with
a broker of its own (``python -m bench.verl_dedup.workload SHAPE MODE``), alternating. Bytes: what the broker's dedup
counters say was put and stored of the deduped fields, and the bytes of the storage folder (write-ahead log and
Lance) after the broker stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import persisting.compat.transfer_queue as tq

SHAPES = ("multimodal", "text-only")
MODES = {"off": False, "auto": "auto"}


def _step(step: int, prompts: int, n: int, image_mib: float, seed: int) -> tuple[list[str], Any]:
    import torch
    from tensordict import NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    keys: list[str] = []
    cols: dict[str, list[Any]] = {"prompts": [], "responses": [], "extra_fields": [], "multi_modal_inputs": []}
    floats = int(image_mib * (1 << 20)) // 4
    for p in range(prompts):
        prompt = torch.randint(0, 150_000, (int(torch.randint(128, 512, (1,), generator=g)),), generator=g)
        pixels = torch.rand((floats // 1176, 1176), generator=g) if image_mib else None
        for s in range(n):
            keys.append(f"s{step}p{p}_{s}_0")
            cols["prompts"].append(prompt)
            cols["responses"].append(torch.randint(0, 150_000, (int(torch.randint(256, 1024, (1,), generator=g)),)))
            cols["extra_fields"].append({"reward_extra_info": {"acc": float(s % 2)}, "turns": [1, 2]})
            if pixels is not None:
                grid = torch.tensor([[1, pixels.shape[0] // 4, 4]])
                cols["multi_modal_inputs"].append({"pixel_values": pixels.clone(), "image_grid_thw": grid})
    fields: dict[str, Any] = {
        "prompts": torch.nested.as_nested_tensor(cols["prompts"], layout=torch.jagged),
        "responses": torch.nested.as_nested_tensor(cols["responses"], layout=torch.jagged),
        "extra_fields": NonTensorStack(*cols["extra_fields"]),
    }
    if image_mib:
        fields["multi_modal_inputs"] = NonTensorStack(*cols["multi_modal_inputs"])
    return keys, TensorDict(fields, batch_size=[len(keys)])


def run_one(shape: str, mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One (shape, dedup) run in this process: its own broker, ``--steps`` timed steps after a warm-up."""
    os.environ["XDG_RUNTIME_DIR"] = str(work / "run")
    (work / "run").mkdir()
    storage = work / "data"
    image = args.image_mib if shape == "multimodal" else 0
    section = {"storage_path": str(storage), "arena_bytes": args.arena_mib << 20, "dedup": MODES[mode]}
    tq.init({"persisting": section})
    times: list[float] = []
    try:
        for step in range(args.steps + 1):
            keys, td = _step(step, args.prompts, args.n, image, args.seed)
            start = time.perf_counter()
            tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=[{"status": "success"} for _ in keys])
            got = tq.kv_batch_get(keys=keys, partition_id="train")
            took = time.perf_counter() - start
            if got.batch_size[0] != len(keys):
                raise RuntimeError(f"read {got.batch_size[0]} samples of {len(keys)}")
            tq.kv_clear(keys=keys, partition_id="train")
            if step:  # the first step warms up (imports, the broker's first Lance files)
                times.append(took)
        plane = tq.interface._plane
        if plane is None:
            raise RuntimeError("init() made no data plane")
        address = plane.address
        status = subprocess.run([sys.executable, "-m", "broker", "status", "--json", "--socket", address],
                                capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
        topic = next(t for t in json.loads(status.stdout)["topics"] if t["name"] == "transfer_queue")
        counters = dict(topic.get("dedup") or {})
    finally:
        tq.close()
    disk = sum(f.stat().st_size for f in storage.rglob("*") if f.is_file())
    # the median of one run's steps: the run's figure (the harness takes the median over runs)
    return {"step_s": statistics.median(times), "disk": disk, **counters}


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The step's shape: the suite's flags and this module's."""
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8, 1+)")
    p.add_argument("--n", type=int, default=4, help="responses per prompt (default 4, 1+)")
    p.add_argument("--image-mib", type=float, default=1.0, help="pixel_values per prompt, MiB (default 1, above 0)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per run, after one warm-up (default 5, 1+)")
    p.add_argument("--arena-mib", type=int, default=512, help="the broker's arena, MiB (default 512, 1+)")


def workload_argv(args: argparse.Namespace) -> list[str]:
    """``args``'s step shape as this module's command line (and the seed)."""
    out = [f"--seed={args.seed}"]
    for name in ("prompts", "n", "image_mib", "steps", "arena_mib"):
        out.append(f"--{name.replace('_', '-')}={getattr(args, name)}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.verl_dedup.workload", description=__doc__.split("\n\n")[0])
    p.add_argument("shape", choices=SHAPES)
    p.add_argument("mode", choices=tuple(MODES))
    add_workload_args(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    p.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pvd-", dir=args.dir) as work:
        print(json.dumps(run_one(args.shape, args.mode, args, Path(work))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
