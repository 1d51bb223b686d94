"""``python -m bench broker --plot DIR``: the round trips' CDF and the 2x2 runs' record rates."""

from __future__ import annotations

from pathlib import Path

from bench.harness.plots import cdf as _cdf
from bench.harness.plots import pyplot as _plt
from bench.harness.plots import save as _save

from .workload import BrokerBenchResult


def plot_broker(result: BrokerBenchResult, folder: Path, sub: str) -> list[Path]:
    plt = _plt()
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
