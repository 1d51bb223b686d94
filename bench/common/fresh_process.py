"""A run of a suite in a fresh Python process (its own imports, broker and memory peaks, nothing left from the run
before): ``python -m MODULE ARGS...`` whose last stdout line is the run's result as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: ``bench`` is importable from it
RUN_TIMEOUT_S = 1800


def run_json(module: str, args: Sequence[str], what: str, timeout_s: float = RUN_TIMEOUT_S) -> Any:
    """``python -m module *args`` in ROOT; its last stdout line parsed. A failed run raises RuntimeError naming
    ``what`` with the end of its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])
