"""``python -m bench arena --plot DIR``: GB/s per path and batch size, latency CDFs, throughput over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.plots import cdf as _cdf
from bench.harness.plots import pyplot as _plt
from bench.harness.plots import save as _save

from .pair import ArenaBenchResult, Row

GB = 1e9


def plot_arena(result: ArenaBenchResult, folder: Path, sub: str) -> list[Path]:
    plt = _plt()
    out = []
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
