"""Flush moments of a broker's topics during a bench run (for the throughput-over-time plot).

A thread asks the broker for its ``status`` every ``interval`` seconds over its own ZeroMQ socket and notes the
``time.monotonic()`` (the clock the bench workers stamp batches with) at which a topic's flush count grew. Only
runs with ``--plot`` start it: the polls cost the broker a little CPU.
"""

from __future__ import annotations

import itertools
import threading
import time
from types import TracebackType

import zmq

from persisting.wire import protocol

POLL_INTERVAL_S = 0.05


class FlushWatch:
    def __init__(self, address: str, interval: float = POLL_INTERVAL_S) -> None:
        self.address = address
        self.interval = interval
        self.flushes_at: list[float] = []  # monotonic times at which some topic's flush count had grown
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flush-watch", daemon=True)

    def __enter__(self) -> FlushWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        seen: dict[str, int] = {}
        try:
            for i in itertools.count(1):
                if self._stop.wait(self.interval):
                    return
                sock.send_multipart(protocol.encode_request(protocol.Request(i, "status", {})))
                if not sock.poll(2000):
                    continue
                reply = protocol.decode_reply(sock.recv_multipart())
                while sock.poll(0):  # a late reply to an earlier poll
                    reply = protocol.decode_reply(sock.recv_multipart())
                now = time.monotonic()
                for topic in reply.result["topics"] if reply.ok else ():
                    if topic["flushes"] > seen.get(topic["name"], topic["flushes"]):
                        self.flushes_at.append(now)
                    seen[topic["name"]] = topic["flushes"]
        finally:
            sock.close()
            ctx.term()
