"""The ``samples`` suite's shape (producers, consumers, batch and take sizes, limits) and what a run measured
(``SamplesBenchResult``): shared by the workload, the TransferQueue reference and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.common.measure import nearest_rank

GROUP_N = 8  # GRPO samples per prompt
PUT_ROWS = 64  # samples per put: 8 whole groups
TAKE = 16  # samples per get_meta: 2 groups
FEATURES = 16  # x is float32[64, 16]
PRODUCERS = 2
CONSUMERS = 4
CASE_LIMIT_S = 120.0  # the workload's processes must be done by then
GET_TIMEOUT_S = 0.5  # get_meta(wait=True, timeout=...): how long an idle consumer waits before it looks again
LATENCY_ROUNDS = 8
PROBE_INTERVAL_S = 0.01  # hello round trips timed during the workload, one per this many seconds
BACKLOG_EVERY_S = 0.05  # backlog sampling period during the workload
BACKLOG = 32_768  # untaken samples in the backlog reference
BACKLOG_CALLS = 100
FRESH_HELLOS = 500  # hello round trips timed before the reference's first put


@dataclass(slots=True)
class Series:
    key: str
    label: str
    samples_us: list[float] = field(default_factory=list)

    def p(self, q: float) -> float | None:
        return nearest_rank(sorted(self.samples_us), q) if self.samples_us else None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "n": len(self.samples_us), "p50_us": self.p(0.5),
                "p99_us": self.p(0.99)}  # fmt: skip


@dataclass(slots=True)
class SamplesBenchResult:
    hello: Series = field(default_factory=lambda: Series("hello", "protocol hello"))
    idle: Series = field(default_factory=lambda: Series("get_meta-idle", "get_meta, samples ready"))
    backlog: Series = field(default_factory=lambda: Series("get_meta-backlog", "get_meta, 32,768 untaken"))
    live: Series = field(default_factory=lambda: Series("get_meta-live", "get_meta, 2 producers + 4 consumers"))
    hello_fresh: Series = field(default_factory=lambda: Series("hello-fresh", "protocol hello before any put"))
    hello_live: Series = field(default_factory=lambda: Series("hello-live", "protocol hello during the workload"))
    tq: Series = field(default_factory=lambda: Series("tq-get_meta-idle", "TransferQueue get_meta, samples ready"))
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds during the workload: broker, producers, ...
    floor_rate: float = 0.0  # bare hello round trips per s, CONSUMERS processes back to back (samples_floor.py)
    workload_s: float = 0.0  # wall seconds the CPU times above were taken over (barrier -> every sample taken)
    max_backlog: int = 0  # most samples put and not yet taken, sampled every 50 ms during the workload
    total: int = 0  # samples the producers set out to put
    produced: int = 0  # samples whose put returned
    taken: int = 0  # samples handed to consumers, duplicates included
    unique: int = 0
    duplicates: int = 0
    missing: int = 0  # put, never taken
    foreign: int = 0  # taken indexes outside 0..N-1
    calls: int = 0  # get_meta calls in the workload, empty ones included
    empty_calls: int = 0
    bad_batches: int = 0  # batches not made of whole aligned groups
    per_consumer: list[int] = field(default_factory=list)
    produce_s: float = 0.0  # first worker start -> last put returned
    take_s: float = 0.0  # first worker start -> last sample taken
    errors: list[str] = field(default_factory=list)
    broker_log: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def take_rate(self) -> float:
        return self.unique / self.take_s if self.take_s > 0 else 0.0

    @property
    def produce_rate(self) -> float:
        return self.produced / self.produce_s if self.produce_s > 0 else 0.0

    @property
    def correct(self) -> bool:
        return (
            not self.errors
            and self.unique == self.total
            and not (self.duplicates or self.missing or self.foreign or self.bad_batches)
        )


def whole_groups(indexes: list[int]) -> bool:
    if not indexes or len(indexes) % GROUP_N:
        return False
    for k in range(0, len(indexes), GROUP_N):
        start = indexes[k]
        if start % GROUP_N or indexes[k : k + GROUP_N] != list(range(start, start + GROUP_N)):
            return False
    return True
