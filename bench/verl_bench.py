"""``python -m bench verl``: one verl-shaped training step through persisting's TransferQueue layer and through
TransferQueue 0.1.11 (the ``transferqueue`` extra), in the same run.

A step, as verl 0.9.1's v1 trainer and agent loop make it: the trainer puts the step's prompts (``kv_batch_put``,
tag ``pending``); ``--workers`` rollout processes set each prompt ``running`` (``kv_put``), ``kv_batch_put`` their
trajectories (``--prompts`` prompts x ``--n`` responses in all: jagged int64 prompts,
responses, input_ids, response_mask and float32 rm_scores, a NonTensorStack of dicts, verl's tags) and set each
prompt ``finished``; the trainer lists the partition (``kv_list``), then per data-parallel rank (``--dp``)
``kv_batch_get``s its share of the token columns, writes ``old_log_probs``, ``ref_log_prob`` and ``values`` back
column by column (``kv_batch_put``), reads what the update needs, and ``kv_clear``s the step's keys. Time per step
is from the rollouts' first put to the clear; each backend runs ``--steps`` steps after one warm-up, ``--repeat``
times in fresh processes (alternating backends), and the table gives the median. Peak resident memory (VmHWM
from /proc, shared pages a process touched included) is read for every process of the run before it ends: the
trainer, each rollout worker, and the data plane (persisting: the broker; TransferQueue: its controller and
storage actors, and Ray's own processes).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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


def _tq(backend: str) -> Any:
    import importlib

    return importlib.import_module("persisting.compat.transfer_queue" if backend == "persisting" else "transfer_queue")


def _trajectories(worker: int, step: int, prompts: int, n: int, seed: int) -> tuple[list[str], Any, list[Any]]:
    import torch
    from tensordict import NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + worker)
    keys: list[str] = []
    tags: list[Any] = []
    extra: list[Any] = []
    cols: dict[str, list[Any]] = {c: [] for c in ("prompts", "responses", "input_ids", "response_mask", "rm_scores")}
    for p in range(prompts):
        plen = int(torch.randint(128, 512, (1,), generator=g))
        prompt = torch.randint(0, 150_000, (plen,), generator=g)
        for s in range(n):
            rlen = int(torch.randint(256, 1024, (1,), generator=g))
            resp = torch.randint(0, 150_000, (rlen,), generator=g)
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


def _rollout_worker(backend: str, worker: int, attach: str, prompts: int, n: int, seed: int, inbox: Any,
                    outbox: Any) -> None:  # fmt: skip
    tq = _tq(backend)
    if backend == "transferqueue":
        from bench.common.tq_cluster import tq_attach

        tq_attach(attach)
    else:
        tq.init()
    outbox.put(("ready", worker, os.getpid()))
    while True:
        step = inbox.get()
        if step is None:
            break
        keys, td, tags = _trajectories(worker, step, prompts, n, seed)  # made before the clock starts
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


def _dispatch(tq: Any, step: int, workers: int, prompts: int) -> None:
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


def _train_step(tq: Any, dp: int) -> int:
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


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _peak_rss_mib(pid: int) -> tuple[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return cmd, int(line.split()[1]) / 1024
    return None


def _role(cmd: str, broker: int | None, pid: int, workers: set[int]) -> str:
    if pid == os.getpid():
        return "trainer"
    if pid in workers:
        return "rollout worker"
    if pid == broker or "TransferQueueController" in cmd or "SimpleStorageUnit" in cmd:
        return "data plane"
    if "ray" in cmd or "gcs_server" in cmd or "raylet" in cmd:
        return "Ray (TransferQueue needs it)"
    return "other"


def run_one(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One run of one backend in this process (the trainer); returns step times and peak RSS per role."""
    tq = _tq(backend)
    ctx = mp.get_context("spawn")
    attach = ""
    broker_pid = None
    if backend == "transferqueue":
        from bench.common.tq_cluster import tq_cluster

        cluster = tq_cluster()
        attach = cluster.__enter__()
    else:
        os.environ["XDG_RUNTIME_DIR"] = str(workdir / "run")
        tq.init({"persisting": {"storage_path": str(workdir / "data"), "arena_bytes": args.arena_mib << 20}})
        broker_pid = tq.interface._plane.proc.pid
    inboxes = [ctx.Queue() for _ in range(args.workers)]
    outbox = ctx.Queue()
    per_worker = args.prompts // args.workers
    procs = [
        ctx.Process(
            target=_rollout_worker, args=(backend, w, attach, per_worker, args.n, args.seed, inboxes[w], outbox)
        )
        for w in range(args.workers)
    ]
    try:
        for p in procs:
            p.start()
        pids = {outbox.get(timeout=300)[2] for _ in procs}
        times, rollout_s, train_s = [], [], []
        for step in range(args.steps + 1):
            for box in inboxes:
                box.put(step)
            for _ in procs:
                assert outbox.get(timeout=300)[0] == "made"
            t0 = time.perf_counter()
            _dispatch(tq, step, args.workers, per_worker)  # the trainer puts the step's prompts (pending)
            for box in inboxes:
                box.put("go")
            for _ in procs:
                assert outbox.get(timeout=300)[0] == "done"
            t1 = time.perf_counter()
            got = _train_step(tq, args.dp)
            t2 = time.perf_counter()
            if got != per_worker * args.workers * args.n:
                raise RuntimeError(f"{backend}: step {step} saw {got} trajectories")
            if step:  # the first step warms up
                times.append(t2 - t0)
                rollout_s.append(t1 - t0)
                train_s.append(t2 - t1)
        peaks: dict[str, float] = {}
        for pid in sorted(set(_descendants(os.getpid())) | ({broker_pid} if broker_pid else set())):
            found = _peak_rss_mib(pid)
            if found is None:
                continue
            role = _role(found[0], broker_pid, pid, pids)
            key = f"{role} (max of each)" if role == "rollout worker" else role
            peaks[key] = (
                max(peaks.get(key, 0.0), found[1]) if role == "rollout worker" else peaks.get(key, 0.0) + found[1]
            )
        return {"step_s": statistics.mean(times), "rollout_s": statistics.mean(rollout_s),
                "train_s": statistics.mean(train_s), "peak_rss_mib": peaks}  # fmt: skip
    finally:
        for box in inboxes:
            box.put(None)
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        if backend == "transferqueue":
            cluster.__exit__(None, None, None)
        else:
            tq.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench verl", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="rollout worker processes (default 2)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step, over all workers (default 16)")
    p.add_argument("--n", type=int, default=4, help="responses per prompt (default 4)")
    p.add_argument("--dp", type=int, default=2, help="trainer data-parallel ranks reading their share (default 2)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per run, after one warm-up (default 5)")
    p.add_argument("--repeat", type=int, default=3, help="runs per backend, the median is reported (default 3)")
    p.add_argument("--arena-mib", type=int, default=256, help="persisting broker's arena (default 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=["persisting", "transferqueue"], help="run one backend only")
    p.add_argument("--one", choices=["persisting", "transferqueue"], help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    return p


def _render(results: dict[str, list[dict[str, Any]]], cmd: str, note: str) -> str:
    med: dict[str, dict[str, Any]] = {}
    for backend, runs in results.items():
        roles = sorted({r for run in runs for r in run["peak_rss_mib"]})
        med[backend] = {
            **{k: statistics.median(run[k] for run in runs) for k in ("step_s", "rollout_s", "train_s")},
            "rss": {r: statistics.median(run["peak_rss_mib"].get(r, 0.0) for run in runs) for r in roles},
        }
    lines = [cmd, note, ""]
    header = f"{'':34}" + "".join(f"{b:>16}" for b in med) + ("   TQ / persisting" if len(med) == 2 else "")
    lines.append(header)

    def row(label: str, values: list[float], fmt: str, lower_better: bool = True) -> None:
        cells = "".join(f"{v:>16{fmt}}" for v in values)
        ratio = ""
        if len(values) == 2 and values[0] > 0:
            ratio = f"   {values[1] / values[0]:.2f}x"
        lines.append(f"{label:34}{cells}{ratio}")

    for key, label in (("step_s", "time per step (ms)"), ("rollout_s", "  rollout puts (ms)"),
                       ("train_s", "  trainer's part (ms)")):  # fmt: skip
        row(label, [m[key] * 1000 for m in med.values()], ".1f")
    roles = sorted({r for m in med.values() for r in m["rss"]})
    for role in roles:
        row(f"peak RSS {role} (MiB)", [m["rss"].get(role, 0.0) for m in med.values()], ".0f")
    total = [sum(m["rss"].values()) for m in med.values()]
    row("peak RSS, all processes (MiB)", total, ".0f")
    lines.append(f"median of {min(len(r) for r in results.values())} runs per backend")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.one:
        with tempfile.TemporaryDirectory(prefix="pvb-", dir=args.dir) as work:
            print(json.dumps(run_one(args.one, args, Path(work))))
        return 0
    backends = [args.only] if args.only else ["persisting", "transferqueue"]
    if "transferqueue" in backends:
        from bench.common.tq_cluster import tq_missing

        missing = tq_missing()
        if missing:
            print(f"TransferQueue {missing}", file=sys.stderr)
            backends.remove("transferqueue")
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    passthrough = [
        a for a in (argv if argv is not None else sys.argv[1:]) if a not in ("--only",) and a not in backends
    ]
    for _ in range(args.repeat):
        for backend in backends:  # alternating: a slow spell of the machine hits both
            proc = subprocess.run([sys.executable, "-m", "bench.verl_bench", *passthrough, "--one", backend],
                                  cwd=ROOT, capture_output=True, text=True, timeout=1800)  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"{backend} run failed:\n{proc.stderr[-4000:]}")
            results[backend].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    shape = (f"{args.workers} rollout workers, {args.prompts} prompts x n={args.n} = {args.prompts * args.n} "
             f"trajectories per step (prompt 128-511, response 256-1023 tokens), dp={args.dp}, "
             f"{args.steps} steps after a warm-up")  # fmt: skip
    cmd = f"python -m bench verl {shlex.join(argv if argv is not None else sys.argv[1:])}"
    print(_render(results, cmd, shape))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
