"""Prometheus metrics of the broker (``--metrics ADDRESS``; off by default), in prometheus_client's exposition.

Two kinds of series. Counters and histograms are updated as requests finish and flushes land (puts, takes and
bytes per topic and partition, request latency per operation, flush durations and sizes, bad frames); with
metrics off the broker holds ``None`` instead of this object and pays one ``is None`` test per request. Gauges
(backlog per task, arena bytes, WAL size, flush lag, connections) are read at scrape time from the same map the
status command prints (``status.snapshot``), built on the broker's loop: the scrape's thread asks the loop for
it and waits, so serving a scrape never blocks the loop and the engine is only touched from its own thread.

Where it serves: ``PORT`` or ``HOST:PORT`` (a bare port binds 127.0.0.1) with prometheus_client's own HTTP
server in a daemon thread; ``unix:PATH`` with a small HTTP/1.0 responder on the broker's loop whose body comes
from prometheus_client's ``generate_latest`` in a worker thread (prometheus_client has no unix-socket server, and
the systemd unit allows AF_UNIX only; a local agent or ``curl --unix-socket`` scrapes it).

Label cardinality: partitions are often one per training step, so each labelled family keeps at most
``MAX_SERIES_PER_FAMILY`` label sets; later ones are counted under ``partition="_other"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from persisting.errors import ConfigError
from persisting.tensors.column import storage_dtype
from persisting.wire.protocol import Reply
from persisting.wire.replies import (
    Range,
    RunEntry,
    TakenNoted,
    TakenWithData,
    TakenWithDataNoted,
    Views,
)
from persisting.wire.requests import TENSOR_FIELD_ITEMS, Args, GetData, MarkConsumed, PutBatch, PutTensors, Take

from .complaints import KINDS
from .requests.context import Call

log = logging.getLogger("persisting.broker")

MAX_SERIES_PER_FAMILY = 1000
OTHER = "_other"
SCRAPE_STATE_TIMEOUT_S = 5.0
MAX_HTTP_REQUEST_BYTES = 8192
HTTP_READ_TIMEOUT_S = 5.0
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)
FLUSH_SECONDS_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FLUSH_RECORDS_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


class _Capped:
    """Label sets of one family, at most MAX_SERIES_PER_FAMILY; later partitions become ``_other``."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, ...]] = set()

    def __call__(self, *labels: str) -> tuple[str, ...]:
        if labels in self._seen:
            return labels
        if len(self._seen) < MAX_SERIES_PER_FAMILY:
            self._seen.add(labels)
            return labels
        return (labels[0], OTHER, *labels[2:])


class BrokerMetrics:
    def __init__(self, state: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        disable_created_metrics()  # no "_created" twin of every series (this process is the broker's own)
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.request_seconds = Histogram(
            "persisting_request_seconds",
            "Time the broker spent on a request, from decoding to its reply (excludes queueing on the socket)",
            ["op"],
            registry=r,
            buckets=LATENCY_BUCKETS_S,
        )
        self.put_samples = Counter(
            "persisting_put_samples", "Records/samples stored by puts", ["topic", "partition"], registry=r
        )
        self.put_bytes = Counter(
            "persisting_put_bytes",
            "Bytes stored by puts (rows plus arena tensor payload)",
            ["topic", "partition"],
            registry=r,
        )
        self.taken_samples = Counter(
            "persisting_taken_samples",
            "Samples handed to a task by get_meta/get_batch",
            ["topic", "partition", "task"],
            registry=r,
        )
        self.data_bytes = Counter(
            "persisting_get_data_bytes",
            "Bytes of sample data handed out (views in the arena plus copies over the socket)",
            ["topic"],
            registry=r,
        )
        self.bad_frames = Counter(
            "persisting_bad_frames", "Messages refused: malformed, protocol version, bad request", ["kind"], registry=r
        )
        for kind in KINDS:
            self.bad_frames.labels(kind)  # present at 0 from the start, so rate() works on the first one
        self.flush_seconds = Histogram(
            "persisting_flush_seconds",
            "Duration of one flush to Lance",
            ["topic"],
            registry=r,
            buckets=FLUSH_SECONDS_BUCKETS_S,
        )
        self.flush_records = Histogram(
            "persisting_flush_records",
            "Records written by one flush to Lance",
            ["topic"],
            registry=r,
            buckets=FLUSH_RECORDS_BUCKETS,
        )
        self._capped_puts = _Capped()
        self._capped_takes = _Capped()
        self._flushed: dict[str, tuple[int, float, int]] = {}  # topic -> (flushes, seconds, records) seen
        self._state = _StateCollector(state)
        r.register(self._state)
        self._counted: dict[type[Args], Callable[[Call[Any], Any, list[bytes]], None]] = {
            PutBatch: self._put,
            PutTensors: self._put,
            Take: self._taken,
            MarkConsumed: self._consumed,
            GetData: self._data,
        }

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the broker's state is read on (scrapes ask it from their own thread)."""
        self._state.loop = loop

    # -- from the broker's loop ---------------------------------------------------------------------

    def request(self, call: Call[Any], reply: Reply, seconds: float) -> None:
        self.request_seconds.labels(call.op).observe(seconds)
        if reply.ok:
            counted = self._counted.get(type(call.args))  # what a request of this kind adds to the counters
            if counted is not None:
                counted(call, reply.result, reply.buffers)

    def _put(self, call: Call[PutBatch | PutTensors], result: Any, buffers: list[bytes]) -> None:
        args = call.args
        nbytes = sum(len(b) for b in call.buffers)
        if isinstance(args, PutTensors):
            nbytes += sum(f[5] for f in args.fields if len(f) == TENSOR_FIELD_ITEMS and type(f[5]) is int)
        labels = self._capped_puts(args.topic, args.partition)
        self.put_samples.labels(*labels).inc(result.count)
        self.put_bytes.labels(*labels).inc(nbytes)

    def _taken(self, call: Call[Take], result: Any, buffers: list[bytes]) -> None:
        args = call.args
        labels = self._capped_takes(args.topic, args.partition, args.task)
        self.taken_samples.labels(*labels).inc(len(result.indexes))
        if isinstance(result, TakenWithData | TakenWithDataNoted):
            self.data_bytes.labels(args.topic).inc(_data_bytes(result.data, buffers))
        if isinstance(result, TakenNoted | TakenWithDataNoted) and args.note is not None and result.noted:
            self._rider_put(args.topic, args.note.partition, result.noted.count, 0)  # (requests/riders.py)

    def _consumed(self, call: Call[MarkConsumed], result: Any, buffers: list[bytes]) -> None:
        spec = call.args.then_put
        if spec is not None and isinstance(result, Range):  # a then_put's records (requests/riders.py)
            self._rider_put(call.args.topic, spec.partition, result.count, sum(len(b) for b in call.buffers))

    def _data(self, call: Call[GetData], result: Any, buffers: list[bytes]) -> None:
        self.data_bytes.labels(call.args.topic).inc(_data_bytes(result, buffers))

    def _rider_put(self, topic: str, partition: str, samples: int, nbytes: int) -> None:
        labels = self._capped_puts(topic, partition)
        self.put_samples.labels(*labels).inc(samples)
        self.put_bytes.labels(*labels).inc(nbytes)

    def bad_frame(self, kind: str) -> None:
        self.bad_frames.labels(kind).inc()

    def flushed(self, topic: str, flushes: int, seconds_total: float, records_total: int) -> None:
        """After a flush: the topic's cumulative flush counters (Topic.metrics); one observation per new flush
        (several flushes between two calls are observed as one, averaged)."""
        last_n, last_s, last_r = self._flushed.get(topic, (0, 0.0, 0))
        self._flushed[topic] = (flushes, seconds_total, records_total)
        n = flushes - last_n
        if n <= 0:
            return
        for _ in range(n):
            self.flush_seconds.labels(topic).observe((seconds_total - last_s) / n)
            self.flush_records.labels(topic).observe((records_total - last_r) / n)


def _data_bytes(result: Any, buffers: list[bytes]) -> int:
    out = sum(len(b) for b in buffers)
    if isinstance(result, Views):
        for run in result.runs:
            for entry in run:
                if isinstance(entry, RunEntry):
                    out += entry.samples * entry.sample_bytes
                else:  # a jagged field: its values along the ragged dimension, times the other dimensions
                    itemsize = storage_dtype(entry.kind, entry.dtype).itemsize
                    out += entry.total * math.prod(d for d in entry.shape if d >= 0) * itemsize
    return out


class _StateCollector:
    """Gauges from the status map, fetched from the broker's loop at scrape time (in the scrape's thread)."""

    def __init__(self, state: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self._state = state
        self.loop: asyncio.AbstractEventLoop | None = None

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("persisting_state_up", "1 if the broker answered the scrape's state query in time")
        loop = self.loop
        if loop is None or _running_loop() is loop:  # never wait for the loop on the loop itself
            up.add_metric([], 0)
            return [up]
        future = asyncio.run_coroutine_threadsafe(_call(self._state), loop)
        try:
            state = future.result(SCRAPE_STATE_TIMEOUT_S)
        except Exception as exc:
            future.cancel()
            log.warning("a metrics scrape could not read the broker's state: %r", exc)
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, *_gauges(state)]


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _call(state: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    return await state()


def _gauges(state: dict[str, Any]) -> Iterator[Metric]:
    def family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=labels)

    records = family("persisting_topic_records", "Records (and samples) of the topic", ["topic"])
    unflushed = family("persisting_unflushed_records", "Records acknowledged, not yet flushed to Lance", ["topic"])
    wal = family("persisting_wal_bytes", "Size of the topic's write-ahead log", ["topic"])
    lag = family("persisting_flush_lag_seconds", "How long the oldest unflushed record may have waited", ["topic"])
    samples = family("persisting_partition_samples", "Samples of the partition, not cleared", ["topic", "partition"])
    backlog = family(
        "persisting_task_backlog_samples", "Samples not yet handed to the task", ["topic", "partition", "task"]
    )
    leased = family("persisting_task_leased_samples", "Samples leased to the task now", ["topic", "partition", "task"])
    dedup_put = family("persisting_dedup_put_bytes", "Bytes of deduped fields as producers put them", ["topic"])
    dedup_stored = family(
        "persisting_dedup_stored_bytes", "Bytes of deduped fields stored (each distinct value once)", ["topic"]
    )
    capped_parts, capped_tasks = _Capped(), _Capped()
    for t in state["topics"]:
        name = t["name"]
        records.add_metric([name], t["records"])
        dedup = t.get("dedup") or {}
        dedup_put.add_metric([name], dedup.get("put_bytes", 0))
        dedup_stored.add_metric([name], dedup.get("stored_bytes", 0))
        unflushed.add_metric([name], t["unflushed_records"])
        wal.add_metric([name], t["wal_bytes"])
        lag.add_metric([name], t["flush_lag_s"])
        for partition, part in t["partitions"].items():
            if capped_parts(name, partition)[1] == OTHER:
                continue  # gauges of a partition beyond the cap would double up: left out
            samples.add_metric([name, partition], part["samples"])
            for task, s in part["tasks"].items():
                if capped_tasks(name, partition, task)[1] != OTHER:
                    backlog.add_metric([name, partition, task], s["backlog"])
                    leased.add_metric([name, partition, task], s["leased"])
    yield from (records, unflushed, wal, lag, samples, backlog, leased, dedup_put, dedup_stored)
    arena = state["arena"]
    if arena:
        by_state = family("persisting_arena_bytes", "Shared-memory arena bytes by state", ["state"])
        for label, key in (("size", "size_bytes"), ("used", "used_bytes"), ("free", "free_bytes")):
            by_state.add_metric([label], arena[key])
        by_state.add_metric(["leased"], arena["leased_bytes"])
        by_state.add_metric(["unpersisted"], arena["unpersisted_bytes"])
        by_state.add_metric(["budget"], arena.get("budget_bytes", arena["size_bytes"]))  # size: the segments now
        holds = family("persisting_arena_holds", "Consumer holds on arena extents", [])
        holds.add_metric([], arena["holds"])
        yield from (by_state, holds)
    conns = state["connections"]
    connected = family("persisting_connected_clients", "ZeroMQ connections open to the broker", [])
    connected.add_metric([], conns["connected"])
    processes = family("persisting_client_processes", "Client processes that said hello and still run", [])
    processes.add_metric([], len(state["clients"]))
    drops = CounterMetricFamily(
        "persisting_disconnects", "Connections closed (by clients, or by ZeroMQ for an oversized message)"
    )
    drops.add_metric([], conns["disconnects"])
    yield from (connected, processes, drops)


class MetricsServer:
    """Serves ``metrics.registry`` at ``address``: ``PORT``, ``HOST:PORT`` or ``unix:PATH``."""

    def __init__(self, metrics: BrokerMetrics, address: str, socket_mode: int = 0o600) -> None:
        self.metrics = metrics
        self.address = address
        self.socket_mode = socket_mode
        self._http: Any = None
        self._unix: asyncio.AbstractServer | None = None
        self._path: Path | None = None

    async def start(self) -> None:
        self.metrics.attach(asyncio.get_running_loop())
        if self.address.startswith("unix:"):
            self._path = Path(self.address[len("unix:") :])
            self._path.unlink(missing_ok=True)
            old_umask = os.umask(0o777 & ~self.socket_mode)
            try:
                self._unix = await asyncio.start_unix_server(self._answer, path=str(self._path))
            except OSError as exc:
                raise ConfigError(f"cannot serve metrics on {self.address}: {exc}") from exc
            finally:
                os.umask(old_umask)
            return
        host, port = parse_tcp(self.address)
        try:
            self._http, _thread = start_http_server(port, addr=host, registry=self.metrics.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc

    @property
    def bound(self) -> str:
        """Where it serves (the real port when 0 was asked for)."""
        if self._http is not None:
            host, port = self._http.server_address[:2]
            return f"{host}:{port}"
        return self.address

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HTTP_READ_TIMEOUT_S)
            if len(head) > MAX_HTTP_REQUEST_BYTES or not head.startswith(b"GET "):
                writer.write(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            else:
                body = await asyncio.to_thread(generate_latest, self.metrics.registry)
                writer.write(
                    b"HTTP/1.0 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                    % (CONTENT_TYPE_LATEST.encode(), len(body))
                )
                writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self) -> None:
        if self._http is not None:
            await asyncio.to_thread(self._http.shutdown)
            self._http.server_close()
            self._http = None
        if self._unix is not None:
            self._unix.close()
            await self._unix.wait_closed()
            self._unix = None
            if self._path is not None:
                self._path.unlink(missing_ok=True)


def parse_tcp(address: str) -> tuple[str, int]:
    """``9464`` -> 127.0.0.1:9464 (localhost unless a host is named); ``HOST:PORT`` as given."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(
            f"--metrics must be PORT, HOST:PORT or unix:PATH (e.g. 9464 or unix:/run/persisting/metrics.sock), "
            f"got {address!r}"
        ) from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"--metrics port must be 0..65535, got {number}")
    return host, number
