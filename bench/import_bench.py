"""``python -m bench imports --runs 5 [--against DIR]``: what a fresh process pays to import persisting.

Each statement runs in a fresh interpreter (``python -c``), the wall time of the whole process measured, the
cases interleaved run by run so that the load of the moment falls on each alike; the median of ``--runs`` is
reported, less a bare ``python -c pass`` of the same run, and as a ratio to ``import persistqueue`` (persist-queue
1.1.0, the reference a persist-queue worker pays). ``--against DIR`` also times a second checkout (e.g. ``git
worktree add --detach /tmp/old main``) in the same runs, so before and after are measured in the same minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
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


def run(runs: int, against: Path | None) -> dict[str, Any]:
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
    med = {case: statistics.median(v) for case, v in times.items()}
    bare = med[("this", "pass")]
    ref = med[("this", "import persistqueue")] - bare
    rows = [
        {
            "tree": name,
            "statement": s,
            "median_s": round(med[(name, s)], 3),
            "import_s": round(med[(name, s)] - bare, 3),
            "vs_persistqueue": round((med[(name, s)] - bare) / ref, 2) if s != "pass" else None,
            "loaded": loaded[(name, s)],
        }
        for name, s in cases
    ]
    return {"runs": runs, "trees": {k: str(v) for k, v in trees.items()}, "load": os.getloadavg(), "rows": rows}


def render(result: dict[str, Any]) -> str:
    out = [
        f"median of {result['runs']} fresh processes each, interleaved; load {result['load'][0]:.1f}; "
        "import s = the process less a bare `python -c pass`"
    ]
    out.append(f"{'tree':>8}  {'statement':<38} {'process s':>9} {'import s':>9} {'x persistqueue':>14}  loaded")
    for r in result["rows"]:
        ratio = "" if r["vs_persistqueue"] is None else f"{r['vs_persistqueue']}x"
        loaded = ", ".join(r["loaded"]) or "-"
        out.append(f"{r['tree']:>8}  {r['statement']:<38} {r['median_s']:>9} {r['import_s']:>9} {ratio:>14}  {loaded}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench imports", description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per statement (the median is reported)")
    parser.add_argument("--against", type=Path, help="another checkout to time in the same runs (before/after)")
    parser.add_argument("--format", choices=("console", "json"), default="console")
    args = parser.parse_args(argv)
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    if args.against is not None and not (args.against / "persisting" / "__init__.py").is_file():
        raise SystemExit(f"--against {args.against}: no persisting/__init__.py there; give a checkout's root")
    result = run(args.runs, args.against)
    print(json.dumps(result, indent=2) if args.format == "json" else render(result))
    return 0
