"""The broker's CPU per request, warm, in one process, without ZeroMQ or a scheduler between requests:
``python -m bench broker-steps``.

A broker (``broker.server.Broker``, no arena) on this process's event loop; its replies go to a list instead of the
socket. Per series, ``--chunk`` (default 1,000) requests encoded the way the client encodes them go through
``Broker._start`` (what the broker does per message after its receive: decode, hello or the reply cache, dispatch,
the engine, the reply's encode) and the thread's CPU time (``time.thread_time_ns``) is divided by the count: a
``put_batch`` of one ~100-byte record at ``durability="process"`` (its log frame written with ``pwrite``, as in
the ``broker`` bench's ``put`` series) and a ``hello``. ``--chunks`` (default 12) of each, interleaved; min and
median per request. Every reply is checked to be a success. Run it on two checkouts (``PYTHONPATH=<checkout>
python -m bench broker-steps`` from that checkout) to compare before and after: CPU time is what the machine's load
disturbs least. In the real ping-pong each of these microseconds costs several (a request between two idle waits
runs on cold caches, docs/benchmarks/broker.md).
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

from bench.harness import Probe
from broker.server import Broker
from persisting.client.request_keys import put_key
from persisting.engine import TopicConfig
from persisting.wire import codec, protocol

IDENTITY = b"\x00bench"
WARM_PUTS = 200


async def measure(chunk: int, chunks: int, base: Path) -> dict[str, list[float]]:
    """Per series, the CPU microseconds per request of each chunk."""
    broker = Broker(base / "storage", f"ipc://{base}/unused.sock")
    await broker.start()
    broker._loop = asyncio.get_running_loop()
    sent: list[list[bytes]] = []
    broker._send = sent.append  # type: ignore[method-assign,assignment]  # the reply frames, checked below
    cfg = TopicConfig(durability="process", batch_size=10**6, auto_flush_interval_sec=3600.0)  # no flush meanwhile
    config = {key: getattr(cfg, key) for key in ("num_buckets", "bucket_column", "batch_size")}
    config.update(auto_flush_interval_sec=cfg.auto_flush_interval_sec, durability=cfg.durability)
    batch = codec.encode_batch([{"id": 1, "text": "x" * 70, "score": 0.5}], {})
    blob = codec.pack(batch.rows)
    ids = iter(range(1, 1 << 62))

    def put() -> list[bytes]:
        args: dict[str, Any] = {"topic": "t", "config": config, "partition": "default", "kinds": batch.kinds}
        args.update(count=1, key=put_key())
        return [IDENTITY, *protocol.encode_request(protocol.Request(next(ids), "put_batch", args, [blob]))]

    def hello() -> list[bytes]:
        return [IDENTITY, *protocol.encode_request(protocol.Request(next(ids), "hello", {}))]

    try:
        for _ in range(WARM_PUTS):  # the topic opened (its first put awaits the open), the caches warm
            broker._start(put())
        await asyncio.sleep(0.5)
        results: dict[str, list[float]] = {"put_batch (process)": [], "hello": []}
        for _ in range(chunks):
            for (label, per_chunk), make in zip(results.items(), (put, hello), strict=True):
                messages = [make() for _ in range(chunk)]
                sent.clear()
                t0 = time.thread_time_ns()
                for frames in messages:
                    broker._start(frames, (1, 1))
                per_chunk.append((time.thread_time_ns() - t0) / chunk / 1e3)
                if len(sent) != chunk or not all(protocol.decode_reply(s[1:]).ok for s in sent):
                    raise RuntimeError(f"{label}: {chunk - len(sent)} requests unanswered or an error reply")
        return results
    finally:
        await broker.close()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench broker-steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk", type=int, default=1000, help="requests per timed chunk")
    parser.add_argument("--chunks", type=int, default=12, help="timed chunks per series (interleaved)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pbs-") as tmp:
        results = asyncio.run(measure(args.chunk, args.chunks, Path(tmp)))
    for label, values in results.items():
        low, mid = min(values), statistics.median(values)
        print(f"{label:20s} broker CPU per request: min {low:6.2f} us, median {mid:6.2f} us")
    return 0


PROBE = Probe(
    "broker-steps", "the broker's CPU per request, warm, in one process (no ZeroMQ between requests)", parser, main
)

if __name__ == "__main__":
    sys.exit(main())
