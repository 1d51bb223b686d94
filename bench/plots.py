"""``--plot DIR``: PNGs of a bench run, for what reads better as a picture than as a table (matplotlib, the bench
extra; the Agg backend, no display needed). Each function writes its files and returns their paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common.plots import cdf as _cdf
from bench.common.plots import pyplot as _plt
from bench.common.plots import run_label as _run_label
from bench.common.plots import save as _save

from .arena_pair import ArenaBenchResult, Row
from .broker_bench import BrokerBenchResult
from .queue_bench import BenchResult
from .samples_bench import SamplesBenchResult

GB = 1e9


def plot_arena(result: ArenaBenchResult, folder: Path) -> list[Path]:
    plt = _plt()
    out = []
    sub = _run_label(result.meta)
    stream = [r for r in result.rows if r.mode in ("stream", "copy") and not r.key.endswith("-beyond")]
    sizes = sorted({r.batch_bytes for r in stream})
    paths = list(dict.fromkeys(r.path for r in stream))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(paths), 1)
    for k, path in enumerate(paths):
        xs, ys = [], []
        for i, size in enumerate(sizes):
            row = next((r for r in stream if r.path == path and r.batch_bytes == size), None)
            if row is not None:
                xs.append(i + (k - (len(paths) - 1) / 2) * width)
                ys.append(row.gbps)
        bars = ax.bar(xs, ys, width, label=path)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(sizes)), [f"{s / 2**20:.0f} MiB" for s in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("GB/s (producer -> consumer, stream)")
    ax.set_title("Tensor batches between two processes")
    ax.legend(fontsize=8)
    out.append(_save(fig, folder, "arena_gbps.png", sub))

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result.rows:
        if r.latency_ms and r.mode in ("stream", "paced"):
            _cdf(ax, r.latency_ms, f"{r.path}, {r.mode}, {r.shape}")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("hand-over ms (consumer has the batch - producer's put returned)")
    ax.set_ylabel("fraction of batches")
    ax.set_title("Hand-over latency, CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    out.append(_save(fig, folder, "arena_latency_cdf.png", sub))

    timed = [r for r in result.rows if r.received_s and r.path.startswith("persisting") and r.mode == "stream"]
    if timed:
        fig, axes = plt.subplots(len(timed), 1, figsize=(7, 1.9 * len(timed) + 0.6), sharex=False, squeeze=False)
        for ax, r in zip(axes[:, 0], timed, strict=True):
            _throughput_over_time(ax, r)
        out.append(_save(fig, folder, "arena_throughput_over_time.png", sub))
    return out


def _throughput_over_time(ax: Any, r: Row) -> None:
    ts = r.received_s
    gb = [(i + 1) * r.batch_bytes / GB for i in range(len(ts))]
    ax.plot(ts, gb, lw=1.2, label="received (cumulative GB)")
    for k, t in enumerate(r.flushes_s):
        ax.axvline(t, color="tab:red", lw=0.8, alpha=0.6, label="broker flush to Lance" if k == 0 else None)
    ax.set_title(
        f"{r.path}, {r.shape} x {r.batches}" + (" (beyond the arena)" if "beyond" in r.key else ""), fontsize=8
    )
    ax.set_xlabel("s since the first put", fontsize=7)
    ax.set_ylabel("GB", fontsize=7)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="upper left")


def plot_broker(result: BrokerBenchResult, folder: Path) -> list[Path]:
    plt = _plt()
    sub = _run_label(result.meta)
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in result.latency:
        _cdf(ax, s.samples_us, s.label)
    ax.set_xscale("log")
    ax.set_xlabel("round trip, us")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Broker round trips, CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    out = [_save(fig, folder, "broker_latency_cdf.png", sub)]
    if result.throughput:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [t.label for t in result.throughput]
        produced = [t.produced / t.produce_s if t.produce_s else 0.0 for t in result.throughput]
        consumed = [t.unique / t.consume_s if t.consume_s else 0.0 for t in result.throughput]
        ys = range(len(labels))
        ax.barh([y + 0.2 for y in ys], produced, 0.4, label="produced rec/s")
        ax.barh([y - 0.2 for y in ys], consumed, 0.4, label="consumed rec/s")
        ax.set_yticks(list(ys), labels, fontsize=7)
        ax.set_xlabel("records/s, 2 producer + 2 consumer processes")
        ax.legend(fontsize=7)
        out.append(_save(fig, folder, "broker_throughput.png", sub))
    return out


def plot_samples(result: SamplesBenchResult, folder: Path) -> list[Path]:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in (result.hello, result.idle, result.backlog, result.live, result.hello_live):
        _cdf(ax, s.samples_us, s.label)
    ax.set_xscale("log")
    ax.set_xlabel("call, us")
    ax.set_ylabel("fraction of calls")
    ax.set_title("get_meta through the broker, CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return [_save(fig, folder, "samples_latency_cdf.png", _run_label(result.meta))]


def plot_queue(result: BenchResult, folder: Path) -> list[Path]:
    plt = _plt()
    sub = _run_label(result.meta)
    out = []
    for n in sorted({r.n for r in result.rows}):
        rows = [r for r in result.rows if r.n == n and r.timing is not None]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
        labels = [f"{r.store.label}, {r.store.settings}"[:70] for r in rows]
        ys = list(range(len(rows)))
        ax.barh([y + 0.2 for y in ys], [r.n / r.timing.write_s for r in rows if r.timing], 0.4, label="write rec/s")
        ax.barh([y - 0.2 for y in ys], [r.n / r.timing.read_s for r in rows if r.timing], 0.4, label="read rec/s")
        ax.set_yticks(ys, labels, fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel(f"records/s, N = {n:,}")
        ax.legend(fontsize=7)
        out.append(_save(fig, folder, f"queue_rates_{n}.png", sub))
    if result.flush is not None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.boxplot(
            [[s * 1e3 for s in result.flush.empty.samples_s], [s * 1e3 for s in result.flush.full.samples_s]],
            tick_labels=["empty topic", "topic with rows stored"],
        )
        ax.set_ylabel("flush of 1,000 rows, ms")
        out.append(_save(fig, folder, "queue_flush_cost.png", sub))
    return out
