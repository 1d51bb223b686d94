"""The ``jagged`` suite's workload: verl-shaped jagged token batches from a producer process to a consumer process.

One batch is ``samples`` sequences of int64 token ids, lengths uniform in ``[min_len, max_len]`` (seeded), as a
``torch.nested`` jagged tensor. Four cases, each a spawned producer and a spawned consumer started before a
barrier (start-up is never timed), ``batches`` batches each, the same batches in every case:

- ``persisting jagged``: ``Queue.put({"input_ids": nt})`` through a broker (one per case, fresh storage, 1 GiB
  arena, ``durability="process"``); the consumer's ``get_batch(..., wait=True)`` gets a jagged tensor over arena
  views (values + offsets: the tokens only).
- ``persisting padded``: the same batch padded to ``(samples, max length)`` (how a system without jagged support
  moves it), the same path.
- ``torch.mp jagged``: ``torch.multiprocessing.Queue`` (spawn, file-descriptor sharing): the producer copies
  values and offsets into fresh ``share_memory_()`` tensors and puts them, the consumer rebuilds the jagged
  tensor with ``nested_tensor_from_jagged`` (no copy).
- ``torch.mp padded``: the padded batch through the same queue.

Time of a run: from the barrier to the consumer holding the last batch. Figures: median of ``reps`` runs per case
(the cases interleaved, their order rotated from one rep to the next);
useful throughput counts the token bytes only (8 bytes per real token), so padding shows as lost throughput.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.broker_process import broker_process
from bench.harness import Metric, Report, Table
from persisting import Queue

START_TIMEOUT_S = 120.0
RECV_TIMEOUT_S = 60.0


def lengths_of(samples: int, min_len: int, max_len: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(min_len, max_len + 1, size=samples)


def _batch(spec: dict[str, Any], i: int) -> Any:
    import torch

    lengths = torch.from_numpy(spec["lengths"])
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    values = torch.arange(int(offsets[-1]), dtype=torch.int64) + i  # batch i, recognizable by its first token
    if not spec["padded"]:
        return torch.nested.nested_tensor_from_jagged(values, offsets)
    padded = torch.zeros(len(lengths), spec["max_len"], dtype=torch.int64)
    for k in range(len(lengths)):
        padded[k, : int(lengths[k])] = values[int(offsets[k]) : int(offsets[k + 1])]
    return padded


def _first_token(x: Any) -> int:
    return int(x.values()[0]) if getattr(x, "is_nested", False) else int(x[0, 0])


def _producer(spec: dict[str, Any]) -> None:
    import asyncio

    pool = [_batch(spec, i) for i in range(spec["batches"])]  # made before the barrier: not timed
    if spec["path"] == "torch":
        q = spec["queue"]
        spec["barrier"].wait(START_TIMEOUT_S)
        for x in pool:
            if x.is_nested:
                q.put((x.values().clone().share_memory_(), x.offsets().clone().share_memory_()))
            else:
                q.put(x.clone().share_memory_())
        spec["done"].wait(RECV_TIMEOUT_S * 2)  # the fds must stay servable until the consumer has them
        return

    async def run() -> None:
        async with Queue("jagged", broker=spec["broker"], durability="process") as q:
            await q.put({"input_ids": pool[0]}, partition_id="warm")
            spec["barrier"].wait(START_TIMEOUT_S)
            for x in pool:
                await q.put({"input_ids": x}, partition_id="p", timeout=RECV_TIMEOUT_S)
            await asyncio.to_thread(spec["done"].wait, RECV_TIMEOUT_S * 2)

    asyncio.run(run())


def _consumer(spec: dict[str, Any]) -> None:
    import asyncio

    n, samples = spec["batches"], len(spec["lengths"])

    def check(i: int, x: Any) -> None:
        if _first_token(x) != i:
            raise AssertionError(f"batch {i}: first token {_first_token(x)}")

    try:
        if spec["path"] == "torch":
            import torch

            q = spec["queue"]
            spec["barrier"].wait(START_TIMEOUT_S)
            for i in range(n):
                got = q.get(timeout=RECV_TIMEOUT_S)
                x = torch.nested.nested_tensor_from_jagged(*got) if isinstance(got, tuple) else got
                check(i, x)
                del x, got
            spec["end"].value = time.monotonic()
            return

        async def run() -> None:
            async with Queue("jagged", broker=spec["broker"], durability="process") as q:
                await q.get_batch(["input_ids"], samples, "train", "warm", wait=True, timeout=START_TIMEOUT_S)
                spec["barrier"].wait(START_TIMEOUT_S)
                for i in range(n):
                    data, meta = await q.get_batch(
                        ["input_ids"], samples, "train", "p", wait=True, timeout=RECV_TIMEOUT_S
                    )
                    if meta.size != samples:
                        raise AssertionError(f"batch {i}: {meta.size} samples")
                    check(i, data["input_ids"])
                    data.release()
                spec["end"].value = time.monotonic()

        asyncio.run(run())
    finally:
        spec["done"].set()


def _run_case(path: str, padded: bool, base: Path, args: Any, lengths: np.ndarray, rep: int) -> float:
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    spec: dict[str, Any] = {
        "path": path,
        "padded": padded,
        "lengths": lengths,
        "max_len": args.max_len,
        "batches": args.batches,
        "barrier": ctx.Barrier(3),
        "done": ctx.Event(),
        "end": ctx.Value("d", 0.0),
    }
    if path == "torch":
        spec["queue"] = ctx.Queue()
        return _pair(ctx, spec)
    folder = Path(tempfile.mkdtemp(dir=base))
    address = f"ipc://{folder}/b.sock"
    with broker_process(folder / "data", address, folder / "broker.log", ["--arena-bytes", str(1 << 30)]):
        spec["broker"] = address
        return _pair(ctx, spec)


def _pair(ctx: Any, spec: dict[str, Any]) -> float:
    procs = [ctx.Process(target=_producer, args=(spec,)), ctx.Process(target=_consumer, args=(spec,))]
    for p in procs:
        p.start()
    spec["barrier"].wait(START_TIMEOUT_S)
    t0 = time.monotonic()
    for p in procs:
        p.join(START_TIMEOUT_S + RECV_TIMEOUT_S * 3)
    if any(p.exitcode != 0 for p in procs) or not spec["end"].value:
        raise RuntimeError(f"a worker failed: exit codes {[p.exitcode for p in procs]}")
    return float(spec["end"].value - t0)


CASES = (
    ("persisting jagged", "persisting", False),
    ("persisting padded", "persisting", True),
    ("torch.mp jagged", "torch", False),
    ("torch.mp padded", "torch", True),
)


def run_jagged_bench(base: Path, args: Any) -> dict[str, list[float]]:
    """Seconds of each run per case (``args.reps`` runs each) of the cases in ``args.cases``."""
    lengths = lengths_of(args.samples, args.min_len, args.max_len, args.seed)
    cases = [c for c in CASES if c[0] in args.cases]
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for rep in range(args.reps):  # cases interleaved, the order rotated per rep: drift hits them alike
        for name, path, padded in cases[rep % len(cases) :] + cases[: rep % len(cases)]:
            times[name].append(_run_case(path, padded, base, args, lengths, rep))
    return times


def jagged_report(times: dict[str, list[float]], args: Any) -> Report:
    """ms per batch and useful GB/s per case, medians of the runs; time against ``persisting jagged``."""
    tokens = int(lengths_of(args.samples, args.min_len, args.max_len, args.seed).sum())
    ms, gbps = Metric("ms/batch", higher_is_better=False, digits=4), Metric("useful GB/s")
    table = Table("Producer -> consumer", ("case",), (ms, gbps), (CASES[0][0],), ("MiB moved/batch",), plain_ratio=True)
    for name, _path, padded in (c for c in CASES if c[0] in times):
        moved = args.samples * args.max_len * 8 if padded else tokens * 8 + (args.samples + 1) * 8
        row = table.add(name)
        row.samples = {
            ms.name: [t / args.batches * 1e3 for t in times[name]],
            gbps.name: [tokens * 8 * args.batches / t / 1e9 for t in times[name]],
        }
        row.cells["MiB moved/batch"] = f"{moved / 2**20:.1f}"
    records = (
        f"{args.batches} batches of {args.samples} int64 sequences, lengths {args.min_len}-{args.max_len} "
        f"(seed {args.seed}: {tokens:,} tokens, {tokens * 8 / 2**20:.1f} MiB of tokens per batch)"
    )
    note = f"vs {CASES[0][0]}: time per batch against it (above 1: slower)."
    return Report("Jagged benchmark", [table], [note], meta={"records": records}, data={"runs_s": times})
