"""The report of ``python -m bench chaos``: one row per figure, and which of the figures that must be zero are not
(a failed run names them and the seed that replays its schedule). The four phases' figures are in ``data.figures``
(their table first), the tensor scenario's in ``data.tensors``."""

from __future__ import annotations

from typing import Any

from bench.harness import Report, Table

from .tensor_kills import MUST_BE_ZERO as TENSOR_MUST_BE_ZERO

MUST_BE_ZERO = (
    "acknowledged lost",
    "duplicated",
    "tensor samples not consumed after the drain (broker's count)",
    "acknowledged tensor samples no consumer took",
    "corrupt views seen by consumers",
    "arena bytes leaked (leased_bytes)",
    "arena leases left open",
    "frames without a reply",
    "workers that failed (exit code not 0)",
    "tracebacks in the broker log",
)


def failed(result: dict[str, Any], must_be_zero: tuple[str, ...] = MUST_BE_ZERO) -> list[str]:
    """The figures of ``must_be_zero`` that are not."""
    return [k for k in must_be_zero if result[k]]


def _part(title: str, result: dict[str, Any], must_be_zero: tuple[str, ...]) -> tuple[Table, dict[str, Any], list[str]]:
    figures = {k: v for k, v in result.items() if not k.startswith("_")}
    table = Table(title, ("figure", "value"))
    for key, value in figures.items():
        table.add(key, str(value))
    replay = f"replay the schedule with --seed {result['seed']}"
    bad = [f"{k} = {figures[k]}, must be 0 ({replay})" for k in failed(figures, must_be_zero)]
    return table, figures, bad


def chaos_report(clients: dict[str, Any] | None, tensors: dict[str, Any] | None = None) -> Report:
    tables, data, reasons, notes = [], {}, [], []
    parts = (
        ("figures", clients, "kill -9 of producers, consumers and the broker, then fuzzed frames", MUST_BE_ZERO),
        ("tensors", tensors, "kill -9 of the broker under 6 MiB tensor batches, compacting", TENSOR_MUST_BE_ZERO),
    )
    for key, result, title, must_be_zero in parts:
        if result is None:
            continue
        table, figures, bad = _part(title, result, must_be_zero)
        tables.append(table)
        data[key] = figures
        reasons += bad
        notes += result["_details"]
    if tensors is not None and not tensors["compactions seen (Lance Rewrite commits)"]:
        seed = tensors["seed"]
        reasons.append(f"no compaction ran during the tensor scenario (seed {seed}): it tested less than it says")
    verdict = f"FAILED: {'; '.join(reasons)}" if reasons else "passed"
    notes.append(f"Figures that must be 0: {verdict}.")
    return Report("python -m bench chaos", tables, notes, data=data, failed=reasons)
