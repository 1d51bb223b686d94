"""What every ``--plot`` chart is drawn with: matplotlib on the Agg backend (the bench extra; no display needed),
the run's label under each chart, a file written per figure, a CDF line."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DPI = 120


def pyplot() -> Any:
    """``matplotlib.pyplot`` on Agg; SystemExit naming the extra when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, folder: Path, name: str, subtitle: str) -> Path:
    """``fig`` as ``folder/name`` with ``subtitle`` (the run) under it; the figure is closed."""
    folder.mkdir(parents=True, exist_ok=True)
    fig.text(0.01, 0.005, subtitle, fontsize=7, color="0.4", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = folder / name
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path


def cdf(ax: Any, samples: Sequence[float], label: str) -> None:
    if not samples:
        return
    xs = sorted(samples)
    n = len(xs)
    ax.step(xs, [(i + 1) / n for i in range(n)], where="post", label=label)


def run_label(meta: dict[str, Any]) -> str:
    """The run under each chart: revision, CPUs and the command (with ``python`` for the interpreter's path)."""
    command = str(meta.get("command", "")).replace(sys.executable, "python")
    return f"{meta.get('persisting revision', '?')}; {meta.get('cpus', '?')} CPUs; {command}"[:200]
