"""Transitional: the names bench/harness/legacy.py's ``ray`` entry imports, in the types it expects, until that
entry goes (the ``ray`` suite, bench/ray/, runs ``python -m bench ray``; legacy's entry is never reached)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.render import render
from bench.ray import workload
from bench.ray.report import ray_report


def run_ray_bench(base: Path, *, batches: dict[str, int], reps: int) -> list[dict[str, Any]]:
    times = workload.run_ray_bench(base, batches=batches, reps=reps)
    return [{"batch": label, "batches": batches[label], "times": cases} for label, cases in times.items()]


def render_ray(rows: list[dict[str, Any]]) -> str:
    times = {r["batch"]: r["times"] for r in rows}
    return render(ray_report(times, {r["batch"]: r["batches"] for r in rows}), {}, "md")
