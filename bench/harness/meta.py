"""The run's metadata, read in one place for every suite: the command line, the checkout's revision (and whether
persisting/ differs from it), package versions, the machine (cores, load average, RAM)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import persisting

PACKAGES = ("persisting", "pylance", "pyarrow", "numpy", "msgpack", "pyzmq", "persist-queue", "tqdm")
ROOT = Path(__file__).resolve().parent.parent.parent


def versions(extra: Sequence[str] = ()) -> str:
    """``name version`` of each of ``PACKAGES`` and ``extra`` (extra ones only where installed)."""
    out = []
    for name in (*PACKAGES, *(n for n in extra if n not in PACKAGES)):
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            if name in PACKAGES:
                out.append(f"{name} (not installed)")
    return ", ".join(out)


def git_revision() -> str:
    """The checkout's commit, with "+ local changes" when persisting/ or broker/ differs from it."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--", "persisting", "broker")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + local changes in persisting/ or broker/" if dirty else "")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def machine() -> dict[str, Any]:
    """Cores (all, and those this process may run on), the 1-minute load average, total and available RAM."""
    mem = _meminfo_gib()
    return {
        "cpus": os.cpu_count(),
        "cpus usable": len(os.sched_getaffinity(0)),
        "load average (1 min) at start": f"{os.getloadavg()[0]:.2f}",
        "RAM": f"{mem.get('MemTotal', 0):.1f} GiB, {mem.get('MemAvailable', 0):.1f} GiB available at start",
    }


def _meminfo_gib() -> dict[str, float]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            out[name] = int(rest.split()[0]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return out


def run_meta(argv: Sequence[str], revision: str, work: Path, seed: int, packages: Sequence[str]) -> dict[str, Any]:
    """Everything but what the suite adds and what is known only at the end (load at the end)."""
    return {
        "command": shlex.join([sys.executable, "-m", "bench", *argv]),
        "python": f"{platform.python_implementation()} {platform.python_version()} on {platform.platform()}",
        **machine(),
        "packages": versions(packages),
        "persisting revision": revision,
        "persisting imported from": str(Path(persisting.__file__).parent),
        "seed": seed,
        "work dir": str(work),
    }
