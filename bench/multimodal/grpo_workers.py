"""The processes of the ``grpo`` part of ``python -m bench multimodal`` (bench/multimodal/grpo.py says the step):
the producer and the three consumer tasks of each system, the step's tensors, and the peak RSS each reads of
itself."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.tq_cluster import tq_attach, tq_detach

TASKS = ("reward", "reference", "train")
TOKENS = 1024
TIMEOUT_S = 600.0


def step_tensors(prompts: int, responses: int, image_mib: int, rep: int) -> dict[str, Any]:
    import torch

    width = image_mib * 1024 * 1024 // (4 * 3 * 1024)
    rng = np.random.default_rng(rep)
    images = torch.from_numpy(rng.random((prompts, 3, 1024, width), dtype=np.float32))
    ids = torch.from_numpy(rng.integers(0, 50_000, (prompts * responses, TOKENS)))
    return {"pixel_values": images.repeat_interleave(responses, dim=0), "input_ids": ids}


def pid_vmhwm(pid: int | str = "self") -> list[int]:
    """[peak RSS, shared memory in the RSS now] of a process, bytes: an arena mapping a process has touched (or
    pre-faulted) counts in its RSS, though the pages are one copy for all the processes that map them."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return [int(fields.get(k, "0 kB").split()[0]) * 1024 for k in ("VmHWM", "RssShmem")]


def _vmhwm() -> list[int]:
    return pid_vmhwm()


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
    step = step_tensors(spec["prompts"], spec["responses"], spec["image_mib"], spec["rep"])
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
    from persisting import Queue  # here: a peer's worker never loads persisting (its peak RSS is a figure)

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
    n = spec["prompts"] * spec["responses"]
    dedup = ["pixel_values"] if spec["case"] == "persisting dedup" else False  # asks by name before the 1st put
    from persisting import Queue  # here: a peer's worker never loads persisting (its peak RSS is a figure)

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
