"""The broker's CPU per ``take`` (``get_meta``'s request), in one process, without ZeroMQ or a scheduler between
steps: ``python -m bench samples-cpu``.

A broker (``broker.server.Broker``) runs on this process's event loop with a 256 MiB arena; a client ``Queue`` on
the same loop puts 650 tensor batches of 64 samples (``{"x": float32[64, 16], "len": 64 ints}``, the ``samples``
bench's batches) through its socket. Then, per series, 2,000 decoded requests go straight to
``Broker._dispatch`` and the thread's CPU time (``time.thread_time_ns``) is divided by the count: ``take`` of 16
(``GRPOGroupNSampler(8)``, ``ready_fields=["x"]``, the arguments ``get_meta`` sends, a fresh task per series so
every take hands out samples), and the reference, ``count`` on the same topic (the general dispatch of a topic
request: its config checked, the topic found, a reply built). Series are interleaved, ``--reps`` of each (default
6); medians, and the ratio take / count. Below them, ``Topic.take`` and ``Topic.describe`` of the same takes alone
(one run each). Run it on two checkouts (``PYTHONPATH=<checkout> python -m bench samples-cpu`` from that checkout)
to compare before and after: CPU time is what the machine's load disturbs least.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import Probe
from broker.server import Broker
from persisting import Queue
from persisting.engine.config import TopicConfig
from persisting.engine.samplers import from_wire
from persisting.tensors.arena import peer_id
from persisting.wire import protocol

PUTS = 650  # batches of 64: 41,600 samples, more than the takes of every series hand out
CALLS = 2_000  # requests per series and run
GRPO = {"name": "grpo", "n": 8}


def _requests(task: str) -> dict[str, list[protocol.Request]]:
    """``CALLS`` take and count requests of ``task``, encoded and decoded as the broker receives them."""
    c = TopicConfig(durability="process")  # what this client sends with each request (remote.py)
    config = {
        "num_buckets": c.num_buckets,
        "bucket_column": c.bucket_column,
        "batch_size": c.batch_size,
        "auto_flush_interval_sec": c.auto_flush_interval_sec,
        "durability": c.durability,
    }

    def decoded(op: str, i: int, **args: Any) -> protocol.Request:
        req = protocol.Request(i, op, {"topic": "cpu", "config": config, **args})
        return protocol.decode_request(protocol.encode_request(req))

    take = {"partition": "p", "task": task, "batch_size": 16, "wait": 0.0, "sampler": GRPO, "sampler_kw": {}}
    take |= {"lease_seconds": None, "ready_fields": ["x"], "released": []}
    return {
        "take": [decoded("take", i, key=f"{task}-{i}", peer=peer_id(), **take) for i in range(CALLS)],
        "count": [decoded("count", i) for i in range(CALLS)],
    }


async def measure(base: Path, runs: int) -> dict[str, list[float]]:
    address = f"ipc://{base / 'b.sock'}"
    broker = Broker(base / "storage", address, arena_bytes=256 << 20)
    await broker.start()
    broker.bind()
    serving = asyncio.ensure_future(broker.serve())
    out: dict[str, list[float]] = {}
    try:
        async with Queue("cpu", broker=address, durability="process") as q:
            for _ in range(PUTS):
                await q.put({"x": np.zeros((64, 16), np.float32), "len": list(range(64))}, partition_id="p")
            for run in range(runs):
                series = _requests(f"t{run}")
                for name, reqs in series.items():
                    c0 = time.thread_time_ns()
                    for req in reqs:
                        reply = await broker._dispatch(req, None)
                        if not reply.ok:
                            raise RuntimeError(f"{name} failed: {reply.error_message}")
                    out.setdefault(name, []).append((time.thread_time_ns() - c0) / CALLS / 1e3)
            topic = broker.topics["cpu"]
            c0 = time.thread_time_ns()
            taken = [await topic.take("p", "alone", 16, 0.0, from_wire(GRPO), None, fields=["x"]) for _ in range(CALLS)]
            out["Topic.take alone"] = [(time.thread_time_ns() - c0) / CALLS / 1e3]
            c0 = time.thread_time_ns()
            for indexes in taken:
                await topic.describe(indexes, lenient=True)
            out["Topic.describe alone"] = [(time.thread_time_ns() - c0) / CALLS / 1e3]
    finally:
        broker.stop()
        await serving
    return out


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench samples-cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=6, help="runs, medians reported (default 6)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="samples-cpu-") as tmp:
        out = asyncio.run(measure(Path(tmp), args.reps))
    med = {name: statistics.median(values) for name, values in out.items()}
    for name, values in out.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:22s} {med[name]:7.1f} us CPU per request (median; runs {runs})")
    print(f"take / count: {med['take'] / med['count']:.2f}x")
    return 0


PROBE = Probe("samples-cpu", "the broker's CPU per take (get_meta's request), in one process", parser, main)

if __name__ == "__main__":
    sys.exit(main())
