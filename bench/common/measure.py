"""What every benchmark measures with: nearest-rank percentiles, the progress callback (``Tick``), peak RSS and a
process's RSS polled on a thread (``RssPoll``)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

Tick = Callable[[int], None]  # advance the progress bar by this many units (records, batches, calls)


SYNC_EVERY_BYTES = 64 * 2**20  # a disk reference syncs as often as the broker's flush of that many bytes would


def synced_write_s(path: Path, chunks: Iterable[memoryview]) -> float:
    """Seconds to write ``chunks`` to a new file at ``path`` with ``os.write``, fdatasync'ed every
    ``SYNC_EVERY_BYTES`` and at the end: the disk's reference for bytes that must be persisted. The file goes after."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        unsynced = 0
        for chunk in chunks:
            os.write(fd, chunk)
            unsynced += chunk.nbytes
            if unsynced >= SYNC_EVERY_BYTES:
                os.fdatasync(fd)
                unsynced = 0
        os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


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
    return status_bytes(pid, ("VmRSS",))["VmRSS"]


def status_bytes(pid: int | str, fields: Sequence[str]) -> dict[str, int]:
    """kB figures of /proc/<pid>/status (``VmRSS``, ``RssShmem``, ``RssFile``, ``RssAnon``...) in bytes, from one
    reading; 0 once the process is gone."""
    out = dict.fromkeys(fields, 0)
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in out:
                out[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def reset_peak(pid: int | str = "self") -> None:
    """Start the peak RSS again from the current RSS (Linux: ``5`` into /proc/<pid>/clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


RSS_PARTS = ("VmRSS", "RssShmem", "RssFile", "RssAnon")  # the whole, then what it is made of


class RssPoll:
    """A process's VmRSS and its parts (``RSS_PARTS``: shared memory, file pages, anonymous) read every
    ``interval`` s on a thread between ``start`` and ``stop``: the first VmRSS seen and the largest of each;
    ``take()`` hands the peaks since the last ``take`` and starts them again from the current figures."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid, self.interval = pid, interval
        self.first = 0
        self.peaks = dict.fromkeys(RSS_PARTS, 0)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @property
    def peak(self) -> int:
        return self.peaks["VmRSS"]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def take(self) -> tuple[int, ...]:
        """The peaks of ``RSS_PARTS`` since the last take, or the start."""
        out = tuple(self.peaks.values())
        self.peaks = dict.fromkeys(RSS_PARTS, 0)
        self._read()
        return out

    def _read(self) -> None:
        now = status_bytes(self.pid, RSS_PARTS)
        self.first = self.first or now["VmRSS"]
        self.peaks = {k: max(v, now[k]) for k, v in self.peaks.items()}

    def _poll(self) -> None:
        while True:
            self._read()
            if self._done.wait(self.interval):
                return
