"""Running ``python -m bench`` from the tests: the command in a subprocess (as a user runs it), its JSON report,
a table's rows by one label (and group)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUITE_TIMEOUT_S = 300


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


def smoke(*args: str) -> dict[str, Any]:
    """``python -m bench ARGS --reps 1 --no-progress --dir DIR --format json``, its output parsed; the run's folder
    removed after it and its command in the metadata. DIR is short, not under pytest's ``tmp_path`` (long under
    pytest-xdist): brokers put their unix sockets under it, whose paths are limited to 107 bytes."""
    work = Path(tempfile.mkdtemp(prefix="pbt-"))
    cmd = [sys.executable, "-m", "bench", *args, "--no-progress", "--dir", str(work), "--format", "json"]
    cmd += [] if "--reps" in args else ["--reps", "1"]
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S)
        assert out.returncode == 0, out.stderr[-3000:]
        assert not list(work.iterdir())  # the run's folder removed
    finally:
        shutil.rmtree(work, ignore_errors=True)
    data: dict[str, Any] = json.loads(out.stdout)
    assert data["meta"]["command"].endswith(shlex.join(cmd[3:])) and "persisting revision" in data["meta"]
    return data


def rows_in_groups(table: dict[str, Any], column: str) -> dict[str, dict[str, Any]]:
    """The rows of ``table`` by the label ``column`` (and group, where rows share a label): "group / label"."""
    return {" / ".join(filter(None, (r["group"], r["labels"][column]))): r for r in table["rows"]}
