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
import asyncio
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.broker_process import broker_process

TASKS = ("reward", "reference", "train")
TOKENS = 1024
TIMEOUT_S = 600.0
CASES = ("persisting dedup", "persisting", "torch.mp.Queue", "TransferQueue")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grpo-prompts", type=int, default=8)
    p.add_argument("--grpo-responses", type=int, default=8)
    p.add_argument("--grpo-image-mib", type=int, default=24)
    p.add_argument("--grpo-cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    # The broker's default arena (256 MiB) for both: its shared memory grows within the default budget (issue 31);
    # until then these were 2048 and 512, sized to hold a step.
    p.add_argument("--grpo-arena-mib", type=int, default=256, help="the broker's first segment without dedup")
    p.add_argument("--grpo-dedup-arena-mib", type=int, default=256, help="the broker's first segment with dedup")


def _step(prompts: int, responses: int, image_mib: int, rep: int) -> dict[str, Any]:
    import torch

    width = image_mib * 1024 * 1024 // (4 * 3 * 1024)
    rng = np.random.default_rng(rep)
    images = torch.from_numpy(rng.random((prompts, 3, 1024, width), dtype=np.float32))
    ids = torch.from_numpy(rng.integers(0, 50_000, (prompts * responses, TOKENS)))
    return {"pixel_values": images.repeat_interleave(responses, dim=0), "input_ids": ids}


def _pid_vmhwm(pid: int | str = "self") -> list[int]:
    """[peak RSS, shared memory in the RSS now] of a process, bytes: an arena mapping a process has touched (or
    pre-faulted) counts in its RSS, though the pages are one copy for all the processes that map them."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return [int(fields.get(k, "0 kB").split()[0]) * 1024 for k in ("VmHWM", "RssShmem")]


def _vmhwm() -> list[int]:
    return _pid_vmhwm()


def _warm() -> dict[str, Any]:
    """A small batch each system hands over before the clock starts (connections, mappings, imports)."""
    import torch

    return {"warm": torch.zeros(1, 1024)}


def _check(data: Any, spec: dict[str, Any]) -> None:
    """The consumer got the step: sizes, and the first and last samples' first values as put."""
    n = spec["prompts"] * spec["responses"]
    pv, ids = data["pixel_values"], data["input_ids"]
    if len(pv) != n or len(ids) != n or float(pv[-1][0, 0, 0]) != spec["last_pixel"]:
        raise RuntimeError(f"{spec['case']}: the consumer got a wrong step")


# -- processes -------------------------------------------------------------------------------------


def producer_main(spec: dict[str, Any]) -> None:
    step = _step(spec["prompts"], spec["responses"], spec["image_mib"], spec["rep"])
    out = spec["out"]
    try:
        case = spec["case"]
        if case.startswith("persisting"):
            asyncio.run(_persisting_put(spec, step))
        elif case == "torch.mp.Queue":
            for q in spec["queues"]:
                q.put(_warm())
            spec["barrier"].wait(TIMEOUT_S)
            out["t0"] = time.monotonic()
            for q in spec["queues"]:
                q.put(step)
            spec["done"].wait(TIMEOUT_S)  # the shared memory must stay servable until every consumer has it
        else:
            from tensordict import TensorDict

            from bench.common.tq_cluster import tq_attach, tq_detach

            client = tq_attach(spec["address"])
            try:
                data = TensorDict(step, batch_size=[spec["prompts"] * spec["responses"]])
                client.put(data=TensorDict(_warm(), batch_size=[1]), partition_id=f"warmup-{spec['rep']}")
                spec["barrier"].wait(TIMEOUT_S)
                out["t0"] = time.monotonic()
                client.put(data=data, partition_id=spec["partition"])
                spec["done"].wait(TIMEOUT_S)
            finally:
                tq_detach(client)
        out["producer_rss"] = _vmhwm()
    except BaseException as exc:
        out["error"] = f"producer: {exc!r}"
        spec["barrier"].abort()


async def _persisting_put(spec: dict[str, Any], step: dict[str, Any]) -> None:
    from persisting import Queue

    dedup = ["pixel_values"] if spec["case"] == "persisting dedup" else False
    async with Queue(spec["topic"], broker=spec["address"], dedup=dedup) as q:
        await q.open()
        await q.put(_warm(), partition_id=f"warmup-{spec['rep']}")  # maps the arena before the clock starts
        spec["barrier"].wait(TIMEOUT_S)
        spec["out"]["t0"] = time.monotonic()
        await q.put(step, partition_id=spec["partition"])
        spec["out"]["put_s"] = time.monotonic() - spec["out"]["t0"]
        spec["done"].wait(TIMEOUT_S)


def consumer_main(spec: dict[str, Any], task: str, i: int) -> None:
    import torch  # noqa: F401  (before the clock starts: every system's consumer makes torch tensors)

    out = spec["out"]
    try:
        case = spec["case"]
        if case.startswith("persisting"):
            asyncio.run(_persisting_get(spec, task, i))
        elif case == "torch.mp.Queue":
            spec["queues"][i].get(timeout=TIMEOUT_S)  # the warm-up batch
            spec["barrier"].wait(TIMEOUT_S)
            data = spec["queues"][i].get(timeout=TIMEOUT_S)
            out[f"t_{task}"] = time.monotonic()
            _check(data, spec)
        else:
            _tq_get(spec, task)
        out[f"rss_{task}"] = _vmhwm()
    except BaseException as exc:
        out["error"] = f"consumer {task}: {exc!r}"
        spec["barrier"].abort()


async def _persisting_get(spec: dict[str, Any], task: str, i: int) -> None:
    from persisting import Queue

    n = spec["prompts"] * spec["responses"]
    dedup = ["pixel_values"] if spec["case"] == "persisting dedup" else False  # asks by name before the 1st put
    async with Queue(spec["topic"], broker=spec["address"], dedup=dedup) as q:
        await q.open()
        warm, _ = await q.get_batch(["warm"], 1, task, f"warmup-{spec['rep']}", wait=True, timeout=TIMEOUT_S)
        warm.release()
        spec["barrier"].wait(TIMEOUT_S)
        fields = ["pixel_values", "input_ids"]
        data, meta = await q.get_batch(fields, n, task, spec["partition"], wait=True, timeout=TIMEOUT_S)
        spec["out"][f"t_{task}"] = time.monotonic()
        if meta.size != n:
            raise RuntimeError(f"got {meta.size} samples of {n}")
        _check(data, spec)
        spec["out"][f"rss_{task}"] = _vmhwm()
        data.release()


def _tq_get(spec: dict[str, Any], task: str) -> None:
    from bench.common.tq_cluster import tq_attach, tq_detach

    client = tq_attach(spec["address"])
    try:
        _tq_take(client, ["warm"], 1, f"warmup-{spec['rep']}", task)
        spec["barrier"].wait(TIMEOUT_S)
        fields = ["pixel_values", "input_ids"]
        data = _tq_take(client, fields, spec["prompts"] * spec["responses"], spec["partition"], task)
        spec["out"][f"t_{task}"] = time.monotonic()
        _check(data, spec)
    finally:
        tq_detach(client)


def _tq_take(client: Any, fields: list[str], n: int, partition: str, task: str) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        meta = client.get_meta(data_fields=fields, batch_size=n, partition_id=partition, task_name=task)
        if len(meta):
            return client.get_data(meta)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no batch in {partition}")
        time.sleep(0.001)


# -- the cases -------------------------------------------------------------------------------------


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
    from persisting.tensors import dedup
    from persisting.tensors.column import Column

    pv = _step(args.grpo_prompts, args.grpo_responses, args.grpo_image_mib, 0)["pixel_values"].numpy()
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
    from persisting import SyncQueue

    base.mkdir(parents=True)
    address = f"ipc://{base}/broker.sock"
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
            row["broker_rss"], row["broker_shm"] = _pid_vmhwm(broker.pid)
            row["arena_mib"] = int(arena) // 2**20
            rows.append(row)
    return rows


def _tq_case(ctx: Any, manager: Any, args: argparse.Namespace, logical: int) -> list[dict[str, Any]]:
    from bench.common.tq_cluster import tq_cluster, tq_missing

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


# -- the report ------------------------------------------------------------------------------------


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _rss(m: dict[str, float], who: str) -> str:
    return f"{_mib(m[who + '_rss'])} ({_mib(m[who + '_shm'])} shm)"


def render(rows: list[dict[str, Any]]) -> str:
    by_case: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_case.setdefault(row["case"], []).append(row)
    hashes = by_case.pop("hash", [])
    logical = rows[0]["logical_bytes"] if rows else 0
    med: dict[str, dict[str, float]] = {}
    lines = [
        "### GRPO multimodal step",
        "",
        f"One step, {_mib(logical)} as put (prompts x responses samples, each prompt's image repeated for its "
        "responses), from 1 producer to 3 consumer tasks (reward, reference, train), each its own process.",
        "",
        "| system | hand-over s | vs persisting dedup | bytes stored | of put | arena | broker peak RSS "
        "| producer peak RSS | consumer peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, rs in by_case.items():
        ok = [r for r in rs if r.get("error") is None]
        if not ok:
            med[case] = {}
            continue
        med[case] = {k: statistics.median(r[k] for r in ok) for k in ok[0] if isinstance(ok[0][k], int | float)}
    ref = med.get("persisting dedup", {}).get("handover_s")
    for case, rs in by_case.items():
        m = med[case]
        if not m:
            lines.append(f"| {case} | not measured: {rs[0]['error']} | | | | | | | |")
            continue
        ratio = f"{m['handover_s'] / ref:.2f}x" if ref else ""
        broker = _rss(m, "broker") if "broker_rss" in m else "-"
        arena = _mib(m["arena_mib"] * 2**20) if "arena_mib" in m else "-"
        stored = m["stored_bytes"]
        lines.append(
            f"| {case} | {m['handover_s']:.3f} | {ratio} | {_mib(stored)} | {stored / logical:.3f} | {arena} "
            f"| {broker} | {_rss(m, 'producer')} | {_rss(m, 'consumer')} |"
        )
    if hashes:
        h, v, c = (statistics.median(r[k] for r in hashes) for k in ("hash_s", "verify_s", "copy_s"))
        n = hashes[0]["n"]
        lines += [
            "",
            f"Finding the repeats (xxh3-128 of each of the step's {_mib(n)} of images, in the producer): "
            f"{n / h / 1e9:.2f} GB/s, {h / c:.2f}x the time of a memcpy of the same bytes ({n / c / 1e9:.2f} GB/s), "
            f"which dedup saves {1 - 1 / max(1, hashes[0].get('responses', 1)):.0%} of (and the log, Lance and "
            f"disk bytes with it); with the bytes of every repeat compared (PERSISTING_DEDUP_VERIFY=1) "
            f"{n / v / 1e9:.2f} GB/s, {v / c:.2f}x.",
        ]
    lines += [
        "",
        "vs persisting dedup: the system's hand-over time over persisting-with-dedup's (above 1: persisting is "
        "faster). Bytes stored: persisting's Lance files of the step after a flush; torch and TransferQueue: "
        "the bytes they hold by design (every sample's tensors as put), not measured. Peak RSS: VmHWM, with the "
        "shared memory in it (RssShmem: the arena's pages a process mapped, one copy for all of them; torch's "
        "shared tensors). Arena: the broker's first shared-memory segment; more segments grow within its "
        "default budget, and one process may pin half the budget (PERSISTING_MAX_PINNED_SHARE) beyond its first "
        "hold, else it is answered with copies.",
    ]
    return "\n".join(lines)
