"""The two spawned processes of ``python -m bench sizes`` (bench/sizes/workload.py): a producer and a consumer,
each serving the commands the bench process sends over its end of a ``Pipe`` (``Pair``, the bench's side), one at
a time, and answering each.

Both hold a ``torch.multiprocessing.Queue`` each (one for single hand-overs, one bounded for the stream) and, per
topic, a ``persisting.SyncQueue(topic, broker=address)`` with the default settings, opened before any timing. The
producer's source is one torch uint8 tensor of ``ROWS`` samples, built and faulted in on ``source`` (untimed).

Both take ``("open", topic)`` and ``("close", topic)`` (a queue closed gives back what it leased ahead or holds).
Producer commands: ``("source", nbytes)``, ``("put", system, topic, partition, stamp)`` (its
answer: put started, put returned, ``time.monotonic()``), ``("settle", system, topic)`` (persisting: ``flush()``, so
that the next hand-over starts on a quiet broker; torch: drop the shared copy), ``("memcpy",)`` (the reference:
the source copied into memory faulted in beforehand, then touched like a consumer's result), ``("stream", system,
topic, batches)``, ``("free",)``. Consumer commands: ``("get", system, topic, partition,
stamp)`` (answers ``ready`` first, then what it got), ``("stream", system, topic, batches)``. ``None`` ends either.
A command that fails is answered ``("error", why)`` and the process serves the next one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.common.measure import reset_peak, vm_hwm_bytes, vm_rss_bytes
from bench.common.torch_shared import shared_copy
from persisting import SyncQueue

ROWS = 64  # samples per batch, whatever its size: the per-sample work is the same at every size
PAGE = 4096
FIELD = "x"
TASK = "train"
GET_TIMEOUT_S = 600.0  # a hand-over that takes longer is an error (4 GiB through a spool file on a slow disk)
SETTLE_S = 0.02  # the producer waits this long after the consumer is ready: its request reaches the broker first
STREAM_QUEUE_MAX = 2  # torch.mp's stream queue: batches put and not yet got, at most
REPLY_SLACK_S = 60.0  # a worker that answers nothing this long after its command's own limit is stuck


def touch_pages(x: Any) -> int:
    """Read one byte of every 4 KiB page of a result (a numpy array or a CPU torch tensor): the same code for every
    system, so that each hand-over ends with every page of the batch in the consumer's memory."""
    arr = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
    return int(arr.reshape(-1).view(np.uint8)[::PAGE].sum())


def stamp_of(x: Any) -> int:
    return int(x[0, 0])


def serve(conn: Any, handlers: dict[str, Callable[..., Any]]) -> None:
    """Answer each command with its handler's result (or ``("error", why)``) until ``None``."""
    while True:
        cmd = conn.recv()
        if cmd is None:
            return
        try:
            conn.send(handlers[cmd[0]](*cmd[1:]))
        except Exception as exc:
            conn.send(("error", f"{cmd[0]}: {exc!r}"))


class _Queues:
    """The process's persisting queues, one per topic, opened on ``open`` (before any timing)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.queues: dict[str, SyncQueue] = {}

    def __call__(self, topic: str) -> SyncQueue:
        if topic not in self.queues:
            self.queues[topic] = SyncQueue(topic, broker=self.address)
        return self.queues[topic]

    def open(self, topic: str) -> tuple[str]:
        self(topic)
        return ("ok",)

    def close(self, topic: str | None = None) -> tuple[str]:
        """Close the topic's queue (every queue: None): what it leased ahead or holds goes back to the broker."""
        for name in [topic] if topic is not None else list(self.queues):
            q = self.queues.pop(name, None)
            if q is not None:
                q.close()
        return ("ok",)


def producer_main(conn: Any, queues: tuple[Any, Any], address: str) -> None:
    Producer(conn, queues, address).run()


class Producer:
    def __init__(self, conn: Any, queues: tuple[Any, Any], address: str) -> None:
        self.conn, (self.tq, self.tq_stream) = conn, queues
        self.pq = _Queues(address)
        self.src: Any = None
        self.held: Any = None  # torch: the shared copy of the last put, alive until "settle"

    def run(self) -> None:
        handlers: dict[str, Callable[..., Any]] = {
            "source": self.source,
            "open": self.pq.open,
            "close": self.pq.close,
            "put": self.put,
            "settle": self.settle,
            "memcpy": self.memcpy,
            "stream": self.stream,
            "free": self.free,
        }
        try:
            serve(self.conn, handlers)
        finally:
            self.pq.close()

    def source(self, nbytes: int) -> tuple[str]:
        import torch

        self.src = None
        src = torch.empty((ROWS, nbytes // ROWS), dtype=torch.uint8)
        for i in range(ROWS):
            src[i].fill_(i % 251)  # every page written: faulted in before any timing
        self.src = src
        return ("ok",)

    def _put(self, system: str, topic: str, partition: str) -> None:
        if system == "persisting":
            self.pq(topic).put({FIELD: self.src}, partition_id=partition, timeout=GET_TIMEOUT_S)
        else:
            self.held = shared_copy(self.src)
            self.tq.put({FIELD: self.held})

    def put(self, system: str, topic: str, partition: str, stamp: int) -> tuple[str, float, float]:
        self.src[0, 0] = stamp
        time.sleep(SETTLE_S)
        t0 = time.monotonic()
        self._put(system, topic, partition)
        return ("put", t0, time.monotonic())

    def settle(self, system: str, topic: str) -> tuple[str]:
        self.held = None
        if system == "persisting":
            self.pq(topic).flush()
        return ("ok",)

    def memcpy(self) -> tuple[str, float]:
        src = self.src.numpy()
        dst = np.empty_like(src)
        dst.fill(1)  # faulted in: the reference is the copy, not the page faults
        t0 = time.monotonic()
        dst[:] = src
        touch_pages(dst)
        return ("memcpy", time.monotonic() - t0)

    def stream(self, system: str, topic: str, batches: int) -> tuple[str, float, float]:
        """``batches`` puts back to back; (first put started, last put returned)."""
        time.sleep(SETTLE_S)
        t0 = time.monotonic()
        for k in range(batches):
            self.src[0, 0] = k % 256
            if system == "persisting":
                self.pq(topic).put({FIELD: self.src}, partition_id="stream", timeout=GET_TIMEOUT_S)
            else:
                # blocks while the queue holds its maximum
                self.tq_stream.put({FIELD: shared_copy(self.src)}, timeout=GET_TIMEOUT_S)
        return ("stream", t0, time.monotonic())

    def free(self) -> tuple[str]:
        self.src = self.held = None
        return ("ok",)


def consumer_main(conn: Any, queues: tuple[Any, Any], address: str) -> None:
    pq = _Queues(address)
    tq, tq_stream = queues

    def get(system: str, topic: str, partition: str, source: Any) -> Any:
        if system == "persisting":
            data, meta = pq(topic).get_batch([FIELD], ROWS, TASK, partition, wait=True, timeout=GET_TIMEOUT_S)
            if len(meta) != ROWS:
                raise TimeoutError(f"{len(meta)} of {ROWS} samples within {GET_TIMEOUT_S:g} s")
            return data[FIELD]
        return source.get(timeout=GET_TIMEOUT_S)[FIELD]

    def one(system: str, topic: str, partition: str, stamp: int) -> tuple[Any, ...]:
        """One hand-over: ready, then the batch got and every page touched; the memory it held at that moment."""
        reset_peak()  # the last hand-over's result is gone: the peak from here is this one's
        base = vm_rss_bytes("self")
        conn.send(("ready",))
        x = get(system, topic, partition, tq)
        touch_pages(x)
        t1 = time.monotonic()
        held = vm_hwm_bytes("self") - base
        got = stamp_of(x)
        del x  # held until the hand-over was measured, then dropped
        if got != stamp:
            raise AssertionError(f"stamp {got}, expected {stamp}: not the batch just put")
        return ("got", t1, held)

    def stream(system: str, topic: str, batches: int) -> tuple[Any, ...]:
        reset_peak()
        base = vm_rss_bytes("self")
        conn.send(("ready",))
        for k in range(batches):
            x = get(system, topic, "stream", tq_stream)
            touch_pages(x)
            if stamp_of(x) != k % 256:
                raise AssertionError(f"stream batch {k}: stamp {stamp_of(x)} (order or content broken)")
            del x  # released before the next
        return ("got", time.monotonic(), vm_hwm_bytes("self") - base)

    try:
        serve(conn, {"open": pq.open, "close": pq.close, "get": one, "stream": stream})
    finally:
        pq.close()


class WorkerError(RuntimeError):
    pass


class Pair:
    """The producer and consumer processes (spawned, ``bench/sizes/worker.py``) and their command pipes."""

    def __init__(self, address: str) -> None:
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
        self.queues = queues = (ctx.Queue(), ctx.Queue(maxsize=STREAM_QUEUE_MAX))  # alive while the workers are
        self.conns: dict[str, Any] = {}
        self.procs = []
        for role, target in (("producer", producer_main), ("consumer", consumer_main)):
            mine, theirs = ctx.Pipe()
            self.conns[role] = mine
            self.procs.append(ctx.Process(target=target, args=(theirs, queues, address), name=role, daemon=True))
        for p in self.procs:
            p.start()

    def send(self, role: str, *cmd: Any) -> None:
        self.conns[role].send(cmd)

    def recv(self, role: str, timeout: float = GET_TIMEOUT_S + REPLY_SLACK_S) -> tuple[Any, ...]:
        conn = self.conns[role]
        try:
            if not conn.poll(timeout):
                raise WorkerError(f"the {role} answered nothing within {timeout:.0f} s")
            reply: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError) as exc:
            raise WorkerError(f"the {role} is gone ({exc!r})") from exc
        if reply[0] == "error":
            raise WorkerError(f"{role}: {reply[1]}")
        return reply

    def ask(self, role: str, *cmd: Any) -> tuple[Any, ...]:
        self.send(role, *cmd)
        return self.recv(role)

    def close(self) -> None:
        for conn in self.conns.values():
            with contextlib.suppress(OSError):
                conn.send(None)  # the end of its commands
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
                p.join(10)
