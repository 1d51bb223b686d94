"""The ``grpo`` part of ``python -m bench multimodal``: one GRPO multimodal step handed from a producer to three
consumer tasks (reward, reference, train), each in its own process.

The step: ``--grpo-prompts`` (8) prompts x ``--grpo-responses`` (8) responses; each prompt carries an image tensor
of ``--grpo-image-mib`` (24) MiB (float32, 3 x H x W) that each of its responses repeats, as verl's
``batch.repeat(n, interleave=True)`` leaves it (``pixel_values``: one stacked tensor of prompts x responses
images), and each response its token ids (``input_ids``: 1,024 int64). Every system gets this same TensorDict-like
dict of two torch tensors:

- persisting with dedup (``Queue(dedup=["pixel_values"])``, broker mode, arena): each image stored once;
- persisting without dedup (the same broker setup);
- ``torch.multiprocessing.Queue``: one queue per consumer, the producer puts the step into each (the tensors move
  to shared memory once, at the first put);
- TransferQueue 0.1.11 (the ``transferqueue`` extra; ``tq_cluster``): ``client.put`` of the TensorDict, each task
  ``get_meta`` (polling) then ``get_data``.

Hand-over time: from the producer's put (data ready in its memory) until the last of the three consumers has the
step (``time.monotonic``, one clock for all processes). Bytes stored: persisting's Lance files of the step after a
flush (du of the topic before and after) and the arena bytes the put sealed; torch: the shared-memory bytes its put
created; TransferQueue: what its storage unit holds by design (every sample's tensors as put: not measured). Peak
RSS: ``VmHWM`` of each process (shared pages it touched count: an arena view read counts, one mapped and not
read does not); the consumers' is their largest.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.broker_process import broker_process
from bench.common.tq_cluster import tq_cluster, tq_missing
from persisting import SyncQueue
from persisting.tensors import dedup
from persisting.tensors.column import Column

from .grpo_workers import TASKS, TIMEOUT_S, TOKENS, consumer_main, pid_vmhwm, producer_main, step_tensors


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _one(ctx: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one step of one case; the row of what it measured."""
    manager_out = spec["out"]
    procs = [ctx.Process(target=producer_main, args=(spec,), name="producer")]
    procs += [ctx.Process(target=consumer_main, args=(spec, t, i), name=t) for i, t in enumerate(TASKS)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while any(f"t_{t}" not in manager_out for t in TASKS) and "error" not in manager_out:
            if time.monotonic() > deadline or not all(p.is_alive() or p.exitcode == 0 for p in procs):
                manager_out.setdefault("error", "a process died or the step did not arrive in time")
                break
            time.sleep(0.01)
        spec["done"].set()
        for p in procs:
            p.join(TIMEOUT_S)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    out = dict(manager_out)
    row: dict[str, Any] = {"case": spec["case"], "rep": spec["rep"], "error": out.get("error")}
    if row["error"] is None:
        row["handover_s"] = max(out[f"t_{t}"] for t in TASKS) - out["t0"]
        row["producer_rss"], row["producer_shm"] = out.get("producer_rss", [0, 0])
        row["consumer_rss"], row["consumer_shm"] = max(out.get(f"rss_{t}", [0, 0]) for t in TASKS)
    return row


def _spec(ctx: Any, manager: Any, args: argparse.Namespace, case: str, rep: int) -> dict[str, Any]:
    rng = np.random.default_rng(rep)
    width = args.grpo_image_mib * 1024 * 1024 // (4 * 3 * 1024)
    last = float(rng.random((args.grpo_prompts, 3, 1024, width), dtype=np.float32)[-1, 0, 0, 0])
    return {
        "case": case,
        "rep": rep,
        "prompts": args.grpo_prompts,
        "responses": args.grpo_responses,
        "image_mib": args.grpo_image_mib,
        "last_pixel": last,
        "partition": f"step-{rep}",
        "topic": "grpo",
        "barrier": ctx.Barrier(1 + len(TASKS)),
        "done": ctx.Event(),
        "out": manager.dict(),
    }


def run(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")  # Lance is not fork-safe
    cases = [c.strip() for c in args.grpo_cases.split(",") if c.strip()]
    rows: list[dict[str, Any]] = []
    logical = args.grpo_prompts * args.grpo_responses * (args.grpo_image_mib * 1024 * 1024 + TOKENS * 8)
    rows += _hash_vs_copy(args)
    with ctx.Manager() as manager:
        for case in cases:
            if case.startswith("persisting"):
                rows += _persisting_case(ctx, manager, args, case, base / case.replace(" ", "-"))
            elif case == "torch.mp.Queue":
                for rep in range(args.reps):
                    spec = _spec(ctx, manager, args, case, rep)
                    spec["queues"] = [ctx.Queue() for _ in TASKS]
                    row = _one(ctx, spec)
                    row["stored_bytes"] = logical  # the stacked step moved to shared memory once
                    rows.append(row)
            elif case == "TransferQueue":
                rows += _tq_case(ctx, manager, args, logical)
    for row in rows:
        row["logical_bytes"] = logical
    return rows


def _hash_vs_copy(args: argparse.Namespace) -> list[dict[str, Any]]:
    """What finding the repeats costs (tensors/dedup.py: xxh3-128 of each sample, bytes compared on a match)
    against a memcpy of the same bytes (into memory faulted before), in this process."""
    pv = step_tensors(args.grpo_prompts, args.grpo_responses, args.grpo_image_mib, 0)["pixel_values"].numpy()
    col = Column("tensor", "float32", pv)
    dst = np.ones_like(pv)
    rows = []
    for rep in range(args.reps):
        t = time.perf_counter()
        dedup.distinct_column(col, verify=False)
        hashed = time.perf_counter() - t
        t = time.perf_counter()
        dedup.distinct_column(col, verify=True)
        verified = time.perf_counter() - t
        t = time.perf_counter()
        np.copyto(dst, pv)
        copied = time.perf_counter() - t
        rows.append(
            {"case": "hash", "rep": rep, "error": None, "hash_s": hashed, "copy_s": copied, "n": pv.nbytes}
            | {"responses": args.grpo_responses, "verify_s": verified}
        )
    return rows


def _persisting_case(ctx: Any, manager: Any, args: argparse.Namespace, case: str, base: Path) -> list[dict[str, Any]]:
    base.mkdir(parents=True)
    address = f"ipc://{base}/b.sock"  # short: a unix socket's path is limited to 107 bytes
    rows = []
    arena = str((args.grpo_dedup_arena_mib if case == "persisting dedup" else args.grpo_arena_mib) * 2**20)
    with broker_process(base / "store", address, base / "broker.log", ["--arena-bytes", arena]) as broker:
        for rep in range(args.reps):
            spec = _spec(ctx, manager, args, case, rep)
            spec["address"] = address
            before = _du(base / "store" / "grpo")
            row = _one(ctx, spec)
            with SyncQueue("grpo", broker=address) as q:
                q.flush()
            row["stored_bytes"] = _du(base / "store" / "grpo") - before
            row["broker_rss"], row["broker_shm"] = pid_vmhwm(broker.pid)
            row["arena_mib"] = int(arena) // 2**20
            rows.append(row)
    return rows


def _tq_case(ctx: Any, manager: Any, args: argparse.Namespace, logical: int) -> list[dict[str, Any]]:
    why = tq_missing()
    if why is not None:
        return [{"case": "TransferQueue", "rep": 0, "error": why}]
    rows = []
    with tq_cluster() as address:
        for rep in range(args.reps):
            spec = _spec(ctx, manager, args, "TransferQueue", rep)
            spec["address"] = address
            row = _one(ctx, spec)
            row["stored_bytes"] = logical  # its storage unit holds every sample's tensors as put (by design)
            rows.append(row)
    return rows
