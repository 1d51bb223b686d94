"""What every benchmark measures with: nearest-rank percentiles, the progress callback (``Tick``), peak RSS and a
process's RSS polled on a thread (``RssPoll``)."""

from __future__ import annotations

import math
import threading
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
    return status_bytes(pid, "VmRSS")


def status_bytes(pid: int | str, field: str) -> int:
    """A kB figure of /proc/<pid>/status (``VmRSS``, ``RssShmem``, ``RssAnon``...) in bytes; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak(pid: int | str = "self") -> None:
    """Start the peak RSS again from the current RSS (Linux: ``5`` into /proc/<pid>/clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


class RssPoll:
    """A process's VmRSS read every ``interval`` s on a thread between ``start`` and ``stop``: the first seen and
    the largest, and the largest of its shared-memory part (RssShmem) and of the rest (VmRSS - RssShmem, in one
    reading); ``take()`` hands the peaks since the last ``take`` and starts them again from the current figures."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid, self.interval = pid, interval
        self.first = 0
        self.peak = self.peak_shmem = self.peak_private = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def take(self) -> tuple[int, int, int]:
        """(peak VmRSS, peak RssShmem, peak VmRSS - RssShmem) since the last take, or the start."""
        out = (self.peak, self.peak_shmem, self.peak_private)
        self.peak = self.peak_shmem = self.peak_private = 0
        self._read()
        return out

    def _read(self) -> None:
        rss, shmem = vm_rss_bytes(self.pid), status_bytes(self.pid, "RssShmem")
        self.first = self.first or rss
        self.peak = max(self.peak, rss)
        self.peak_shmem = max(self.peak_shmem, shmem)
        self.peak_private = max(self.peak_private, rss - shmem)

    def _poll(self) -> None:
        while True:
            self._read()
            if self._done.wait(self.interval):
                return
