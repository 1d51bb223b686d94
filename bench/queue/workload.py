"""The ``queue`` suite's workload: every store at every N (``--reps`` runs each), in one process, then the
flush-cost experiment (bench/common/flush.py)."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.common.flush import FlushResult, flush_cost
from bench.common.records import PUT_BATCH, make_records
from bench.queue.stores import STORES, Store, Timing, probe

PROBE_N = 2_000


@dataclass(slots=True)
class Row:
    store: Store
    n: int
    timings: list[Timing] = field(default_factory=list)  # one per rep
    projected_s: float | None = None  # peers only: the projection that let them run, or skipped them

    @property
    def timing(self) -> Timing | None:
        return self.timings[0] if self.timings else None

    @property
    def note(self) -> str:
        if self.timing is None and self.projected_s is not None:
            return f"skipped (projected {self.projected_s:.0f} s)"
        return ""


@dataclass(slots=True)
class BenchResult:
    rows: list[Row]
    flush: FlushResult | None
    peer_limit_s: float
    wall_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def skip_rule(self) -> str:
        return (
            f"persist-queue stores run at a given N only if their write+read time, projected linearly from their "
            f"run at the next smaller N (or from a {PROBE_N:,}-record probe), is at most {self.peer_limit_s:g} s; "
            "otherwise the row says skipped and gives the projection. persisting always runs."
        )


def _project(store: Store, n: int, done: dict[str, Timing], base: Path) -> float | None:
    prev = done.get(store.key)
    if prev is None:
        if n <= PROBE_N:
            return None
        path = base / f"{store.key}-probe"
        prev = probe(store, make_records(PROBE_N, seed=12345), path)
        shutil.rmtree(path, ignore_errors=True)
    return prev.total_s * n / prev.n


def run_queue_bench(
    ns: Sequence[int],
    base: Path,
    *,
    peer_limit_s: float,
    flush_prefill: int,
    flush_reps: int,
    seed: int,
    reps: int = 1,
    stores: Sequence[Store] = STORES,
    progress: bool = True,
) -> BenchResult:
    t_start = time.perf_counter()
    sizes = sorted(set(ns))
    total = sum(2 * n * len(stores) * reps for n in sizes)
    if flush_prefill:
        total += flush_prefill + 2 * PUT_BATCH * (flush_reps + 1)
    rows: list[Row] = []
    done: dict[str, Timing] = {}
    with tqdm(total=total, unit="rec", unit_scale=True, file=sys.stderr, disable=not progress) as bar:
        for n in sizes:
            bar.set_description(f"records N={n:,}")
            records = make_records(n, seed)
            for store in stores:
                row = Row(store, n)
                rows.append(row)
                if store.is_peer:
                    bar.set_description(f"{store.key} N={n:,} probe")
                    row.projected_s = _project(store, n, done, base)
                    if row.projected_s is not None and row.projected_s > peer_limit_s:
                        bar.update(2 * n * reps)
                        continue
                for rep in range(reps):
                    bar.set_description(f"{store.key} N={n:,} rep {rep + 1}")
                    path = base / f"{store.key}-{n}-{rep}"
                    row.timings.append(store.run(records, path, bar.update))
                    shutil.rmtree(path, ignore_errors=True)
                done[store.key] = row.timings[0]
            del records
        flush: FlushResult | None = None
        if flush_prefill:
            bar.set_description(f"flush cost, prefill {flush_prefill:,}")
            path = base / "flush"
            flush = flush_cost(path, flush_prefill, flush_reps, seed, bar.update)
            shutil.rmtree(path, ignore_errors=True)
    return BenchResult(rows, flush, peer_limit_s, wall_s=time.perf_counter() - t_start)
