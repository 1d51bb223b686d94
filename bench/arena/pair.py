"""One ``arena`` benchmark case as it runs: a producer and a consumer process around one start barrier, the
per-batch timestamps they share (put called, put returned, batch received), the messages they send back (errors,
zero-copy evidence, bytes moved), and the Row that a case's timings become."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.arena.batches import MiB, Shape
from bench.common.measure import Tick, nearest_rank
from bench.common.workers import START_TIMEOUT_S, abort_barrier, join_each, watch, worker

RECV_TIMEOUT_S = 60.0  # a consumer that waits this long for the next batch gives up
CASE_LIMIT_S = 150.0  # a case whose processes run longer is stopped (reported as an error)
WARMUP = 2  # untimed batches through the same path before the barrier (arena attach, first faults)


@dataclass(slots=True)
class Row:
    key: str
    path: str
    mode: str  # "stream" or "paced" (memcpy: "copy")
    shape: str
    batch_bytes: int
    batches: int
    settings: str
    received: int = 0
    seconds: float = 0.0
    latency_ms: list[float] = field(default_factory=list)  # put returned -> consumer has the batch
    received_s: list[float] = field(default_factory=list)  # when the consumer had each batch, from the first put
    flushes_s: list[float] = field(default_factory=list)  # broker flushes seen (--plot runs), same clock
    from_start_ms: list[float] = field(default_factory=list)  # put called (before the copy) -> consumer has it
    memcpy_gbps: float | None = None  # the memcpy reference of the same batch size, for the ratio
    copied_bytes: int | None = None  # persisting: bytes the consumer got as copies instead of views
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, key: str, path: str, mode: str, shape: Shape, batches: int, settings: str, **kw: Any) -> Row:
        return cls(key, path, mode, shape.label, shape.batch_bytes, batches, settings, **kw)

    @property
    def gbps(self) -> float:
        return self.received * self.batch_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def p(self, q: float, samples: list[float] | None = None) -> float | None:
        samples = self.latency_ms if samples is None else samples
        return nearest_rank(sorted(samples), q) if samples else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("latency_ms")
        out.pop("from_start_ms")
        out.update(gbps=self.gbps, p50_ms=self.p(0.5), p99_ms=self.p(0.99), latency_n=len(self.latency_ms))
        out.update(from_put_start_p50_ms=self.p(0.5, self.from_start_ms))
        return out


@dataclass(slots=True)
class ArenaBenchResult:
    rows: list[Row] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)  # zero-copy evidence from the consumer
    broker_log: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)


# -- what the workers send back (over spec["errors"]) -----------------------------------------------------------


def report_failure(spec: dict[str, Any], role: str, exc: BaseException) -> None:
    spec["errors"].put(f"{role}: {exc!r}")
    abort_barrier(spec["barrier"])


def report_check(spec: dict[str, Any], path: str, data: dict[str, Any]) -> None:
    spec["errors"].put("check: " + _zero_copy_check(path, data))


def report_moved(spec: dict[str, Any], zero_copy_bytes: int, copied_bytes: int) -> None:
    spec["errors"].put(f"moved: {zero_copy_bytes} {copied_bytes}")


def _shm_mapping(address: int) -> str | None:
    """The file behind the mapping of this process that holds ``address`` (None: not file-backed / not found)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5] if len(parts) == 6 else None
    return None


def _zero_copy_check(path: str, data: dict[str, Any]) -> str:
    out = []
    for name, arr in data.items():
        if isinstance(arr, np.ndarray):
            addr = arr.__array_interface__["data"][0]
            where = _shm_mapping(addr)
            if where is not None and where.startswith("/dev/shm/"):
                place = f"a /dev/shm mapping ({os.path.basename(where)})"
            else:
                place = f"NOT a /dev/shm mapping ({where!r})"
            out.append(
                f"{name}: {type(arr).__name__} {arr.dtype}{list(arr.shape)}, "
                f"flags.writeable={arr.flags.writeable}, data address in {place} of /proc/self/maps"
            )
        else:  # torch
            out.append(f"{name}: torch {arr.dtype}{list(arr.shape)}, is_shared()={arr.is_shared()}")
    return f"{path}: " + "; ".join(out)


# -- running the pair -----------------------------------------------------------------------------------------


def pair_spec(shape: Shape, batches: int, paced: bool, seed: int, check: bool, **extra: Any) -> dict[str, Any]:
    """What both workers of a case are told; ``check``: the consumer reports zero-copy evidence of batch 0."""
    return {"shape": shape, "batches": batches, "paced": paced, "seed": seed, "check": check, **extra}


def run_pair(
    ctx: Any,
    producer: Callable[[dict[str, Any]], None],
    consumer: Callable[[dict[str, Any]], None],
    spec: dict[str, Any],
    row: Row,
    result: ArenaBenchResult,
    tick: Tick,
) -> None:
    """Run ``producer`` and ``consumer`` on ``spec`` and fill ``row`` (and ``result.checks``) from what they did."""
    n = spec["batches"]
    spec.update(
        put_t=ctx.Array("d", n, lock=False),
        start_t=ctx.Array("d", n, lock=False),
        recv_t=ctx.Array("d", n, lock=False),
        received=ctx.Value("q", 0, lock=False),
        t0=ctx.Value("d", 0.0, lock=False),
        barrier=ctx.Barrier(3),
        errors=ctx.SimpleQueue(),
    )
    procs = [
        worker(ctx, producer, spec, "producer", daemon=True),
        worker(ctx, consumer, spec, "consumer", daemon=True),
    ]
    for p in procs:
        p.start()
    seen = 0
    try:
        spec["barrier"].wait(START_TIMEOUT_S)
        seen = watch(procs, spec["received"], tick, CASE_LIMIT_S, interval=0.05)
    except Exception as exc:
        row.errors.append(f"start failed: {exc!r}")
    row.errors += join_each(procs, 5)
    tick(spec["received"].value - seen)
    while not spec["errors"].empty():
        msg = spec["errors"].get()
        if msg.startswith("check: "):
            result.checks.append(msg[len("check: ") :])
        elif msg.startswith("moved: "):
            zero, copied = (int(x) for x in msg.split()[1:])
            row.notes.append(
                f"consumer got {zero / MiB:,.0f} MiB as views on the arena, {copied / MiB:,.0f} MiB as copies "
                "(samples whose extent was already flushed to Lance and dropped are read back from Lance)"
            )
            row.copied_bytes = copied
        else:
            row.errors.append(msg)
    row.received = spec["received"].value
    put_t, recv_t = list(spec["put_t"]), list(spec["recv_t"])
    if row.received:
        row.seconds = recv_t[row.received - 1] - spec["t0"].value
        start_t = list(spec["start_t"])
        row.latency_ms = [(recv_t[i] - put_t[i]) * 1e3 for i in range(row.received) if put_t[i] > 0]
        row.received_s = [recv_t[i] - spec["t0"].value for i in range(row.received)]
        row.from_start_ms = [(recv_t[i] - start_t[i]) * 1e3 for i in range(row.received) if start_t[i] > 0]
