"""The ``imports`` suite's workload: what a fresh process pays to import persisting.

Each statement runs in a fresh interpreter (``python -c``), the wall time of the whole process measured, the
cases interleaved run by run so that the load of the moment falls on each alike; the median of the runs
(``--reps``) is reported, less a bare ``python -c pass`` of the same runs, and as a ratio to ``import persistqueue``
(persist-queue 1.1.0, the reference a persist-queue worker pays). ``--against DIR`` also times a second checkout
(e.g. ``git worktree add --detach /tmp/old main``) in the same runs, so before and after are measured in the same
minutes.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import Metric, Report, Table

ROOT = Path(__file__).resolve().parent.parent.parent
STATEMENTS = (
    "pass",
    "import persistqueue",
    "import persisting",
    "import persisting.compat.persistqueue",
    "import lance",
)
REPORTED = ("lance", "pyarrow", "pandas", "torch", "persisting.engine.topic")


def _once(statement: str, tree: Path) -> tuple[float, list[str]]:
    """Seconds of a fresh ``python -c statement`` run in ``tree`` (its persisting first on the path), and which of
    REPORTED it loaded."""
    code = f"{statement}\nimport sys\nprint(','.join(m for m in {REPORTED!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True)
    wall_s = time.perf_counter() - t0
    return wall_s, [m for m in out.stdout.strip().split(",") if m]


def run(
    runs: int, against: Path | None
) -> tuple[dict[str, Path], dict[tuple[str, str], list[float]], dict[Any, list[str]]]:
    """The trees, each case's seconds per run (tree, statement), and what each case loaded."""
    trees = {"this": ROOT, **({"against": against.resolve()} if against is not None else {})}
    cases = [(name, s) for name in trees for s in STATEMENTS if name == "this" or "persisting" in s]
    times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    loaded: dict[tuple[str, str], list[str]] = {}
    for name, s in cases:  # one unmeasured round: the .pyc files are written, the page cache is warm
        _once(s, trees[name])
    for _ in range(runs):
        for name, s in cases:
            wall_s, loaded[(name, s)] = _once(s, trees[name])
            times[(name, s)].append(wall_s)
    return trees, times, loaded


def imports_report(runs: int, against: Path | None) -> Report:
    trees, times, loaded = run(runs, against)
    bare = statistics.median(times[("this", "pass")])
    process, imports = Metric("process s", higher_is_better=False), Metric("import s", higher_is_better=False)
    table = Table("Fresh process importing", ("tree", "statement"), (imports, process), ("import persistqueue",))
    table.extra, table.plain_ratio = ("loaded",), True
    for (name, s), values in times.items():
        row = table.add(name, s, key=s if name == "this" else f"{name}: {s}")
        # median(t - bare) == median(t) - bare: the import's own time, less a bare interpreter's start
        row.samples = {imports.name: [t - bare for t in values], process.name: values}
        row.cells["loaded"] = ", ".join(loaded[(name, s)]) or "-"
    note = (
        "import s = the process less a bare `python -c pass` (median of the same runs); vs import persistqueue: "
        "import s against persist-queue's (above 1: slower)."
    )
    return Report("Import benchmark", [table], [note], data={"trees": {k: str(v) for k, v in trees.items()}})
