"""The demo's RL step: a rollout process, a reward process and two trainer processes on one broker.

The rollout process puts prompts' responses (GRPO groups of ``GROUP_N``); the reward process takes them as they
come and writes a ``reward`` field to those same samples (``put(..., batch_meta=meta)``) and tags the best
ones; the trainer processes of task "train" ask for ``tokens`` and ``reward`` with ``GRPOGroupNSampler``, so
they only ever get samples whose reward is written, in whole groups, each sample to one of them. At the end the
partition is cleared. Run by ``persisting.demo`` (``./dev demo``); each role is ``python -m persisting.demo.rl
ROLE ADDRESS PARTITION [RANK]``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import numpy as np

from .. import GRPOGroupNSampler, Queue

TOPIC = "demo-rl"
PROMPTS = 64
GROUP_N = 8  # responses per prompt
PROMPTS_PER_PUT = 4
TOKENS = 256  # per response
WAIT_S = 30.0  # how long any role waits for its next batch before it gives up (the demo then fails)


def _reward_of(tokens: np.ndarray) -> np.ndarray:
    return (tokens[:, 0] % 7).astype(np.float32)  # a stand-in reward model: cheap, and checkable by the trainer


async def rollout(address: str, partition: str) -> None:
    rng = np.random.default_rng(0)
    async with Queue(TOPIC, broker=address) as q:
        for first in range(0, PROMPTS, PROMPTS_PER_PUT):
            n = PROMPTS_PER_PUT * GROUP_N  # whole groups per put: a group's responses are consecutive samples
            prompt = np.repeat(np.arange(first, first + PROMPTS_PER_PUT), GROUP_N)
            tokens = rng.integers(0, 50_000, size=(n, TOKENS), dtype=np.int64)
            await q.put({"prompt": prompt, "tokens": tokens}, partition_id=partition)


async def reward(address: str, partition: str) -> None:
    async with Queue(TOPIC, broker=address) as q:
        done = 0
        while done < PROMPTS * GROUP_N:
            batch = PROMPTS_PER_PUT * GROUP_N
            meta = await q.get_meta(["tokens"], batch, "reward", partition, wait=True, timeout=WAIT_S)
            if meta.size == 0:
                raise SystemExit("demo: the reward process waited in vain for rollouts")
            with await q.get_data(meta) as data:
                scores = _reward_of(data["tokens"])
            await q.put({"reward": scores}, partition_id=partition, batch_meta=meta)  # fields of the same samples
            best = {i: {"best": True} for i, s in zip(meta.global_indexes, scores.tolist(), strict=True) if s == 6}
            if best:
                await q.set_custom_meta(meta.with_custom_meta(best))
            done += meta.size
    print(f"  reward process {os.getpid()}: wrote `reward` to {done} samples after their rollout", flush=True)


async def train(address: str, partition: str, rank: int) -> None:
    total = PROMPTS * GROUP_N
    sampler = GRPOGroupNSampler(GROUP_N)
    async with Queue(TOPIC, broker=address) as q:
        got = batches = tagged = 0
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            fields = ["prompt", "tokens", "reward"]  # handed out only once the reward process wrote "reward"
            meta = await q.get_meta(fields, 2 * GROUP_N, "train", partition, sampler, wait=True, timeout=0.2)
            if meta.size == 0:
                if (await q.partitions())[partition]["tasks"].get("train", {}).get("consumed", 0) >= total:
                    break  # the other rank took the rest
                continue
            with await q.get_data(meta) as data:
                if not (data["reward"] == _reward_of(data["tokens"])).all():
                    raise SystemExit("demo: a trainer got a reward that is not its sample's")
                prompts = data["prompt"].reshape(-1, GROUP_N)
                if not (prompts == prompts[:, :1]).all():
                    raise SystemExit("demo: a trainer got a batch that splits a GRPO group")
            tagged += sum(1 for tags in meta.custom_meta if tags.get("best"))
            got += meta.size
            batches += 1
    print(
        f"  trainer rank {rank} ({os.getpid()}): {got} samples in {batches} batches of whole groups, every "
        f"reward there ({tagged} tagged best)",
        flush=True,
    )


def run(address: str) -> None:
    """The whole step, from the demo's process: start the roles, wait for them, show and clear the partition."""
    partition = f"step-{os.getpid()}"  # a new partition each run: the demo's storage keeps earlier runs
    me = [sys.executable, "-m", "persisting.demo.rl"]
    t0 = time.perf_counter()
    roles = [subprocess.Popen([*me, "train", address, partition, str(rank)]) for rank in range(2)]
    roles.append(subprocess.Popen([*me, "reward", address, partition]))
    roles.append(subprocess.Popen([*me, "rollout", address, partition]))
    codes = [p.wait() for p in roles]  # every one of them: the broker must not stop under a role still running
    if any(codes):
        raise SystemExit("demo: a role of the RL step failed")
    elapsed = time.perf_counter() - t0

    async def finish() -> None:
        async with Queue(TOPIC, broker=address) as q:
            before = (await q.partitions())[partition]
            cleared = await q.clear(partition_id=partition)
            print(
                f"  {PROMPTS} prompts x {GROUP_N} responses through rollout -> reward -> 2 trainer ranks in "
                f"{elapsed:.2f} s; partition {partition!r}: {before['samples']} samples, taken by "
                f"{ {t: s['consumed'] for t, s in before['tasks'].items()} }; cleared {cleared} of them"
            )

    asyncio.run(finish())


def main() -> None:
    role, address, partition, *rest = sys.argv[1:]
    if role == "rollout":
        asyncio.run(rollout(address, partition))
    elif role == "reward":
        asyncio.run(reward(address, partition))
    elif role == "train":
        asyncio.run(train(address, partition, int(rest[0])))
    else:
        raise SystemExit(f"unknown role {role!r}: rollout, reward or train")


if __name__ == "__main__":
    main()
