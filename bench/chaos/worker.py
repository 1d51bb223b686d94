"""A client process of ``python -m bench chaos``, killed with SIGKILL at a random moment by the harness.

    python -m bench.chaos.worker ADDRESS produce WORKER STOP_FILE   put batches until STOP_FILE exists
    python -m bench.chaos.worker ADDRESS consume WORKER STOP_FILE   take tensor batches (delivery="ack") until then

A producer alternates a put_batch of 4 records (topic ``chaos-records``, field ``id``: str) and a tensor batch of
4 samples (topic ``chaos-tensors``, partition ``p``: ``obs`` float32[4, 1024] through the arena, ``id`` int64),
and prints ``ACK <id> ...`` once a put returned (what the harness counts as acknowledged). A put that raises
``BrokerUnavailableError`` (a broker killed and not back within the request timeout) is retried with the key the
error carries, so a retry never stores twice. A consumer holds zero-copy views of what it takes, checks them,
prints ``GOT <id> ...``, then ``mark_consumed`` and ``DONE <id> ...``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import numpy as np

from persisting import BrokerUnavailableError, Queue

RECORDS_TOPIC = "chaos-records"
TENSORS_TOPIC = "chaos-tensors"
SAMPLES_PER_PUT = 4
OBS_FLOATS = 1024
LEASE_SECONDS = 10.0  # a take whose answer was lost with a killed broker is handed out again after this


def _say(word: str, ids: list[int] | list[str]) -> None:
    os.write(1, (word + " " + " ".join(map(str, ids)) + "\n").encode())  # one write: a kill never splits it


async def _retrying(put, *args, **kw):  # type: ignore[no-untyped-def]
    key = None
    while True:
        try:
            return await put(*args, idempotency_key=key, **kw)
        except BrokerUnavailableError as exc:
            key = exc.idempotency_key  # the same put again: stored once whatever the first attempt did
            os.write(1, b"RETRY\n")


async def _opened(q: Queue) -> Queue:
    """Open ``q``, again while the broker is away (it may be restarting as this process starts)."""
    while True:
        try:
            return await q.open()
        except BrokerUnavailableError:
            os.write(1, b"REOPEN\n")


async def produce(address: str, worker: int, stop: Path) -> None:
    records, tensors = Queue(RECORDS_TOPIC, broker=address), Queue(TENSORS_TOPIC, broker=address)
    async with await _opened(records), await _opened(tensors):
        n = 0
        while not stop.exists():
            base = (worker * 1_000_000 + n) * SAMPLES_PER_PUT
            ids = list(range(base, base + SAMPLES_PER_PUT))
            if n % 2 == 0:
                await _retrying(records.put_batch, [{"id": str(i)} for i in ids])
            else:
                obs = np.repeat(np.array(ids, dtype=np.float32)[:, None], OBS_FLOATS, axis=1)
                await _retrying(tensors.put, {"obs": obs, "id": np.array(ids, dtype=np.int64)}, partition_id="p")
            _say("ACK", ids)
            n += 1


async def _again(call, *args, **kw):  # type: ignore[no-untyped-def]
    """A take or an acknowledgement, again while the broker is away (a lost take's lease ends and its samples
    come back: acknowledged delivery is at-least-once)."""
    while True:
        try:
            return await call(*args, **kw)
        except BrokerUnavailableError:
            os.write(1, b"RETRY\n")


async def consume(address: str, worker: int, stop: Path) -> None:
    async with await _opened(Queue(TENSORS_TOPIC, broker=address)) as q:
        while not stop.exists():
            data, meta = await _again(
                q.get_batch,
                ["obs", "id"],
                batch_size=8,
                partition_id="p",
                task_name="train",
                delivery="ack",
                lease_seconds=LEASE_SECONDS,
            )
            if meta.size == 0:
                await asyncio.sleep(0.05)
                continue
            ids = [int(i) for i in np.asarray(data["id"])]
            obs = np.asarray(data["obs"])
            want = np.array(ids, dtype=np.float32)  # what the producer wrote (float32 of the id)
            if not (np.all(obs[:, 0] == want) and np.all(obs[:, -1] == want)):
                _say("CORRUPT", ids)
            _say("GOT", ids)
            del data, obs
            await _again(q.mark_consumed, "train", meta, partition_id="p")
            _say("DONE", ids)


def main() -> None:
    address, role, worker, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    asyncio.run(produce(address, worker, stop) if role == "produce" else consume(address, worker, stop))


if __name__ == "__main__":
    main()
