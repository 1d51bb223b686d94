"""Transitional: the names bench/harness/legacy.py's ``storage`` entry imports, in the types it expects, until that
entry goes (the ``storage`` suite, bench/storage/, runs ``python -m bench storage``; legacy's entry is never
reached)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness.render import render
from bench.storage import workload
from bench.storage.report import storage_report


def run_storage_bench(
    base: Path, *, n_small: int, n_tensor: int, tensor_kib: int, reps: int, seed: int
) -> list[dict[str, Any]]:
    series = workload.run_storage_bench(
        base, n_small=n_small, n_tensor=n_tensor, tensor_kib=tensor_kib, reps=reps, seed=seed
    )
    return [asdict(s) for s in series]


def render_storage(rows: list[dict[str, Any]]) -> str:
    return render(storage_report([workload.StoreSeries(**r) for r in rows]), {}, "md")
