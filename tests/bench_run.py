"""Running ``python -m bench`` from the tests: the command in a subprocess (as a user runs it), its JSON report,
a table's rows by one label."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def bench_json(*args: str, timeout: float = 180) -> dict[str, Any]:
    return json.loads(bench(*args, "--no-progress", "--format", "json", timeout=timeout).stdout)


def rows_by(table: dict[str, Any], column: str) -> dict[str, dict[str, Any]]:
    return {r["labels"][column]: r for r in table["rows"]}
