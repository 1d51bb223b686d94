"""What every benchmark measures with: nearest-rank percentiles, the progress callback (``Tick``) and peak RSS."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

Tick = Callable[[int], None]  # advance the progress bar by this many units (records, batches, calls)


def nearest_rank(sorted_samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of ascending ``sorted_samples``, by nearest rank: always a measured value."""
    return sorted_samples[max(0, math.ceil(q * len(sorted_samples)) - 1)]


def vm_hwm_bytes(pid: int | str) -> int:
    """Peak RSS of a process (its own: unlike ru_maxrss, not inherited across fork + exec, as spawn does)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def vm_rss_bytes(pid: int | str) -> int:
    """Resident set size of a process now (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak(pid: int | str = "self") -> None:
    """Start the peak RSS again from the current RSS (Linux: ``5`` into /proc/<pid>/clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
