"""``python -m bench verl-dedup``: the TransferQueue layer's dedup (``persisting.dedup``) on a verl GRPO step, on and
off, in the same run.

A step: ``--prompts`` prompts x ``--n`` responses, each response with jagged int64 prompts/responses (prompt
128-511, response 256-1023 tokens), a NonTensorStack of dicts (verl's ``extra_fields``) and, in the multimodal
shape, ``multi_modal_inputs``: a dict per response holding its prompt's ``pixel_values`` (``--image-mib`` MiB of
float32; a clone per response, as a collate leaves equal values in distinct tensors) and ``image_grid_thw``. The
text-only shape has no image: what dedup costs a run that has nothing to dedup. One process (it starts the broker,
``init(conf)``) ``kv_batch_put``s the step, ``kv_batch_get``s it back (every field), and clears it; ``--steps``
steps after a warm-up, timed from the put to the end of the get. Each (shape, dedup) runs ``--repeat`` times in
fresh processes with a broker of its own, alternating; the table gives the medians. Bytes: what the broker's dedup
counters say was put and stored of the deduped fields, and the bytes of the storage folder (write-ahead log and
Lance) after the broker stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
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
    import persisting.compat.transfer_queue as tq

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
                raise SystemExit(f"read {got.batch_size[0]} samples of {len(keys)}")
            tq.kv_clear(keys=keys, partition_id="train")
            if step:  # the first step warms up (imports, the broker's first Lance files)
                times.append(took)
        plane = tq.interface._plane
        if plane is None:
            raise SystemExit("init() made no data plane")
        address = plane.address
        status = subprocess.run([sys.executable, "-m", "broker", "status", "--json", "--socket", address],
                                capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
        topic = next(t for t in json.loads(status.stdout)["topics"] if t["name"] == "transfer_queue")
        counters = dict(topic.get("dedup") or {})
    finally:
        tq.close()
    disk = sum(f.stat().st_size for f in storage.rglob("*") if f.is_file())
    return {"step_s": statistics.median(times), "disk": disk, **counters}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench verl-dedup", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--n", type=int, default=4, help="responses per prompt (default 4)")
    p.add_argument("--image-mib", type=float, default=1.0, help="pixel_values per prompt, MiB (default 1)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per run, after one warm-up (default 5)")
    p.add_argument("--repeat", type=int, default=3, help="runs per (shape, dedup); the median is given (default 3)")
    p.add_argument("--arena-mib", type=int, default=512, help="the broker's arena (default 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one", nargs=2, metavar=("SHAPE", "MODE"), help=argparse.SUPPRESS)
    return p


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.one:
        with tempfile.TemporaryDirectory(prefix="pvd-") as work:
            print(json.dumps(run_one(args.one[0], args.one[1], args, Path(work))))
        return 0
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.repeat):
        for shape in ("multimodal", "text-only"):
            for mode in MODES:  # alternating: a slow spell of the machine hits every row
                proc = subprocess.run([sys.executable, "-m", "bench.verl_dedup", *argv, "--one", shape, mode],
                                      cwd=ROOT, capture_output=True, text=True, timeout=1800)  # fmt: skip
                if proc.returncode != 0:
                    raise SystemExit(f"{shape} {mode} failed:\n{proc.stderr[-4000:]}")
                runs.setdefault((shape, mode), []).append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"python -m bench verl-dedup {shlex.join(argv)}")
    print(f"{args.prompts} prompts x n={args.n}, multimodal: {args.image_mib} MiB pixel_values per prompt; "
          f"median of {args.repeat} runs of {args.steps} steps")  # fmt: skip
    print(f"{'shape':<11} {'dedup':<5} {'put+get ms':>11} {'vs off':>7} {'on disk':>12} {'vs off':>7} "
          f"{'deduped put':>12} {'stored':>11}")  # fmt: skip
    for shape in ("multimodal", "text-only"):
        ref = runs[(shape, "off")]
        ref_s = statistics.median(r["step_s"] for r in ref)
        ref_disk = statistics.median(r["disk"] for r in ref)
        for mode in MODES:
            rs = runs[(shape, mode)]
            step_s = statistics.median(r["step_s"] for r in rs)
            disk = statistics.median(r["disk"] for r in rs)
            put = statistics.median(r.get("put_bytes", 0) for r in rs)
            stored = statistics.median(r.get("stored_bytes", 0) for r in rs)
            print(f"{shape:<11} {mode:<5} {step_s * 1e3:>11.1f} {step_s / ref_s:>6.2f}x {_mib(disk):>12} "
                  f"{disk / ref_disk:>6.2f}x {_mib(put):>12} {_mib(stored):>11}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
