"""The broker's state as one map: what ``persisting-broker status`` prints (``--json``: this map) and what the
metrics endpoint turns into gauges at scrape time. Built on the broker's loop from the engine's public methods
(``Topic.stats()``, ``Topic.partitions()``), the arena's stats and the connection counts.

Keys (times are seconds; ``*_at`` are Unix times)::

    broker       {"pid", "socket", "storage_path", "protocol", "started_at", "uptime_s"}
    topics       [{"name", "records", "flushed", "unflushed_records", "wal_bytes", "durability",
                   "flush_lag_s": how long the oldest unflushed record may have waited (since the last flush that
                                  left none behind; 0 with nothing unflushed),
                   "flushes", "flush_seconds_total", "last_flush_error" (absent if none),
                   "dedup": {"put_bytes", "stored_bytes", "saved_bytes"}: bytes of deduped fields (Queue(dedup=...))
                            as producers put them and as stored, since the broker started (DedupCounts),
                   "partitions": {partition: {"samples", "cleared",
                                  "tasks": {task: {"consumed", "leased", "backlog": samples not yet handed
                                                   to the task (samples - consumed - leased)}}}}}]
    arena        {} without an arena, else {"path", "size_bytes" (every segment), "first_segment_bytes",
                  "budget_bytes", "segments", "segments_bytes", "pool_bytes", "segments_made", "segments_given_back",
                  "free_bytes", "used_bytes", "leased_bytes", "unpersisted_bytes", "sealed_extents",
                  "leased_extents", "holds"}
    connections  {"connected", "accepted", "disconnects"}: ZeroMQ connections now / since start
    clients      [{"pid", "identity", "first_hello", "last_hello"}]: client processes that said hello and run
    bad_frames   {"malformed", "version", "bad_request"}: bad input since start (see complaints.py)
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from persisting.engine import Topic
from persisting.wire import protocol
from persisting.wire.requests import Args, PutBatch, PutTensors

from .complaints import KINDS, Complaints
from .connections import Connections


class Observed(Protocol):
    """What of the broker its status map reads (the Broker implements it)."""

    pid: int
    address: str
    storage_path: Any
    started_at: float
    flush_clock: FlushClock
    dedup: DedupCounts
    connections: Connections
    complaints: Complaints

    @property
    def topics(self) -> dict[str, Topic]: ...

    def arena_stats(self) -> dict[str, Any]: ...


async def snapshot(broker: Observed) -> dict[str, Any]:
    topics = []
    now = time.monotonic()
    for topic in list(broker.topics.values()):
        stats = await topic.stats()
        partitions = await topic.partitions()
        for part in partitions.values():
            for task in part["tasks"].values():
                task["backlog"] = max(0, part["samples"] - task["consumed"] - task["leased"])
        unflushed = int(stats["buffered"])
        clean_since = broker.flush_clock.clean_since(topic.name, unflushed, now)
        entry = {
            "name": stats["name"],
            "records": stats["total_count"],
            "flushed": stats["flushed"],
            "unflushed_records": unflushed,
            "wal_bytes": stats["wal_bytes"],
            "durability": stats["durability"],
            "flush_lag_s": 0.0 if clean_since is None else round(now - clean_since, 3),
            "flushes": topic.metrics.flushes,
            "flush_seconds_total": round(topic.metrics.flush_seconds, 6),
            "partitions": partitions,
        }
        if "last_flush_error" in stats:
            entry["last_flush_error"] = stats["last_flush_error"]
        entry["dedup"] = broker.dedup.of(topic.name)
        topics.append(entry)
    arena = broker.arena_stats()
    if arena:
        arena["used_bytes"] = arena["size_bytes"] - arena["free_bytes"]
    conns = broker.connections
    return {
        "broker": {
            "pid": broker.pid,
            "socket": broker.address,
            "storage_path": str(broker.storage_path),
            "protocol": protocol.PROTOCOL_VERSION,
            "started_at": broker.started_at,
            "uptime_s": round(time.time() - broker.started_at, 3),
        },
        "topics": sorted(topics, key=lambda t: t["name"]),
        "arena": arena,
        "connections": {"connected": conns.connected, "accepted": conns.accepted, "disconnects": conns.disconnects},
        "clients": conns.clients(),
        "bad_frames": {kind: broker.complaints.totals[kind] for kind in KINDS},
    }


class DedupCounts:
    """Per topic, bytes of deduped fields as put and as stored (tensors/dedup.py), from the ``dedup`` argument the
    producer sends with each put ([put, stored]; a producer's word about its own savings, shown, never trusted for
    anything else). Counted from the broker's start; a retried put that was stored once may count twice."""

    def __init__(self) -> None:
        self._bytes: dict[str, list[int]] = {}

    def request(self, args: Args, reply: protocol.Reply) -> None:
        if not reply.ok or not isinstance(args, PutBatch | PutTensors):
            return
        given = args.dedup
        if not (isinstance(given, list) and len(given) == 2 and all(type(x) is int and x >= 0 for x in given)):
            return
        counts = self._bytes.setdefault(args.topic, [0, 0])
        counts[0] += given[0]
        counts[1] += given[1]

    def of(self, topic: str) -> dict[str, int]:
        put, stored = self._bytes.get(topic, (0, 0))
        return {"put_bytes": put, "stored_bytes": stored, "saved_bytes": put - stored}


class FlushClock:
    """Per topic, since when records have been waiting unflushed: the time of the last flush that left none
    behind (or of the topic's opening). Fed by the flush callback; no engine change needed."""

    def __init__(self) -> None:
        self._clean_at: dict[str, float] = {}

    def opened(self, topic: str) -> None:
        self._clean_at.setdefault(topic, time.monotonic())

    def flushed(self, topic: str, left_unflushed: int) -> None:
        if left_unflushed == 0:
            self._clean_at[topic] = time.monotonic()

    def clean_since(self, topic: str, unflushed: int, now: float) -> float | None:
        if unflushed == 0:
            return None
        return self._clean_at.get(topic, now)


def render(state: dict[str, Any]) -> str:
    """The status as text for a person at a terminal."""
    b = state["broker"]
    lines = [
        f"broker pid {b['pid']} on {b['socket']}, storage {b['storage_path']}, protocol {b['protocol']}, "
        f"up {b['uptime_s']:.0f} s",
        f"{'topic':<30} {'records':>12} {'flushed':>12} {'unflushed':>10} {'flush lag s':>11} {'wal bytes':>12}",
    ]
    for t in state["topics"]:
        lines.append(
            f"{t['name']:<30} {t['records']:>12} {t['flushed']:>12} {t['unflushed_records']:>10} "
            f"{t['flush_lag_s']:>11.1f} {t['wal_bytes']:>12}"
        )
        if "last_flush_error" in t:
            lines.append(f"    last flush error: {t['last_flush_error']}")
        d = t.get("dedup") or {}
        if d.get("put_bytes"):
            lines.append(
                f"    dedup: {d['put_bytes']} bytes put, {d['stored_bytes']} stored "
                f"({d['saved_bytes']} saved, {d['put_bytes'] / max(d['stored_bytes'], 1):.1f}x)"
            )
        for name, part in sorted(t["partitions"].items()):
            lines.append(f"    partition {name!r}: {part['samples']} samples, {part['cleared']} cleared")
            for task, s in sorted(part["tasks"].items()):
                lines.append(
                    f"        task {task!r}: backlog {s['backlog']}, consumed {s['consumed']}, leased {s['leased']}"
                )
    arena = state["arena"]
    if arena:
        lines.append(
            f"shared memory: {arena.get('segments', 1)} segment(s) of {arena['size_bytes']} bytes within a budget "
            f"of {arena.get('budget_bytes', arena['size_bytes'])} (first segment {arena['path']})"
        )
        lines.append(
            f"arena: {arena['used_bytes']} used, "
            f"{arena['free_bytes']} free, {arena['leased_bytes']} leased; {arena['sealed_extents']} sealed "
            f"extent(s) ({arena['unpersisted_bytes']} bytes not yet in Lance), {arena['holds']} consumer hold(s), "
            f"{arena['leased_extents']} open lease(s)"
        )
    else:
        lines.append("arena: none (--arena-bytes 0)")
    c = state["connections"]
    lines.append(
        f"connections: {c['connected']} open ({c['accepted']} accepted, {c['disconnects']} closed since start)"
    )
    for client in state["clients"]:
        lines.append(f"    client pid {client['pid']} (connection {client['identity']})")
    bad = state["bad_frames"]
    if any(bad.values()):
        lines.append("bad frames since start: " + ", ".join(f"{n} {kind}" for kind, n in bad.items()))
    return "\n".join(lines)
