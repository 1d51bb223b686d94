"""A blocking caller's CPU per put, warm, against a real broker: ``python -m bench client-steps``.

A ``persisting-broker`` subprocess; in this process a ``SyncQueue`` (``durability="process"``) puts one ~100-byte
record at a time, and a bare DEALER sends the same put's frames (encoded once, fresh ids and keys) and reads
the reply, nothing else. Per series, ``--chunk`` (default 1,000) round trips, and the calling thread's CPU time
(``time.thread_time_ns``: its Python and its syscalls, not its waits for the broker) divided by the count;
``--chunks`` (default 12) of each, interleaved; min and median per put. The difference between the two is what
``SyncQueue.put`` costs the caller over ZeroMQ's own send and receive (checks, encoding, the engine loop's baton,
the coroutine steps). Run it on two checkouts (``PYTHONPATH=<checkout> python -m bench client-steps`` from that
checkout) to compare before and after: CPU time is what the machine's load disturbs least. In the real ping-pong
each of these microseconds costs more (a request between two idle waits runs on cold caches,
docs/benchmarks/broker.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from bench.common.broker_process import broker_process
from bench.common.records import make_records
from bench.harness import Probe
from persisting import SyncQueue
from persisting.client.remote import WIRE_CONFIG_KEYS
from persisting.client.request_keys import put_key
from persisting.engine import TopicConfig
from persisting.wire import codec, protocol

WARM_PUTS = 500


def measure(chunk: int, chunks: int, base: Path) -> dict[str, list[float]]:
    """Per series, the calling thread's CPU microseconds per put of each chunk."""
    address = f"ipc://{base}/broker.sock"
    with broker_process(base / "storage", address, base / "broker.log"):
        queue = SyncQueue("client-steps", broker=address, durability="process")
        bare: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        bare.setsockopt(zmq.LINGER, 0)
        bare.connect(address)
        records = make_records(WARM_PUTS + chunk * chunks)
        wire = TopicConfig(durability="process")  # as the queue's RemoteTopic sends it
        config = protocol.encoded({key: getattr(wire, key) for key in WIRE_CONFIG_KEYS})
        batch = codec.encode_batch(records[:1], {})
        blob = codec.pack(batch.rows)
        ids = iter(range(1, 1 << 62))

        def bare_put(_record: dict[str, Any]) -> None:
            args: dict[str, Any] = {"topic": "client-steps-bare", "config": config, "partition": "default"}
            args.update(kinds=batch.kinds, count=1, key=put_key())
            bare.send_multipart(protocol.encode_request(protocol.Request(next(ids), "put_batch", args, [blob])))
            if not protocol.decode_reply(bare.recv_multipart()).ok:
                raise RuntimeError("the bare socket's put got an error reply")

        try:
            for record in records[:WARM_PUTS]:
                queue.put(record)
                bare_put(record)
            results: dict[str, list[float]] = {"SyncQueue.put": [], "bare socket put": []}
            at = WARM_PUTS
            for _ in range(chunks):
                todo = records[at : at + chunk]
                at += chunk
                for (_label, per_chunk), put in zip(results.items(), (queue.put, bare_put), strict=True):
                    t0 = time.thread_time_ns()
                    for record in todo:
                        put(record)
                    per_chunk.append((time.thread_time_ns() - t0) / chunk / 1e3)
            if len(queue) != at:
                raise RuntimeError(f"the queue holds {len(queue)} records, expected {at}")
            return results
        finally:
            bare.close(linger=0)
            queue.close()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench client-steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk", type=int, default=1000, help="puts per timed chunk")
    parser.add_argument("--chunks", type=int, default=12, help="timed chunks per series (interleaved)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pcs-") as tmp:
        results = measure(args.chunk, args.chunks, Path(tmp))
    for label, values in results.items():
        low, mid = min(values), statistics.median(values)
        print(f"{label:16s} caller CPU per put: min {low:6.2f} us, median {mid:6.2f} us")
    over = statistics.median(results["SyncQueue.put"]) - statistics.median(results["bare socket put"])
    print(f"SyncQueue.put over the bare socket: {over:.2f} us of the caller's CPU per put (medians)")
    return 0


PROBE = Probe(
    "client-steps", "a blocking caller's CPU per put against a real broker, SyncQueue vs a bare socket", parser, main
)

if __name__ == "__main__":
    sys.exit(main())
