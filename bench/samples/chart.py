"""``python -m bench samples --plot DIR``: the get_meta latency CDFs."""

from __future__ import annotations

from pathlib import Path

from bench.harness.plots import cdf as _cdf
from bench.harness.plots import pyplot as _plt
from bench.harness.plots import save as _save

from .result import SamplesBenchResult


def plot_samples(result: SamplesBenchResult, folder: Path, sub: str) -> list[Path]:
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
    return [_save(fig, folder, "samples_latency_cdf.png", sub)]
