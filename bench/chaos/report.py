"""The report of ``python -m bench chaos``: one row per figure, and which of the figures that must be zero are not
(a failed run names them and the seed that replays its schedule)."""

from __future__ import annotations

from typing import Any

from bench.harness import Report, Table

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


def failed(result: dict[str, Any]) -> list[str]:
    """The figures of ``MUST_BE_ZERO`` that are not."""
    return [k for k in MUST_BE_ZERO if result[k]]


def chaos_report(result: dict[str, Any]) -> Report:
    figures = {k: v for k, v in result.items() if not k.startswith("_")}
    table = Table("kill -9 of producers, consumers and the broker, then fuzzed frames", ("figure", "value"))
    for key, value in figures.items():
        table.add(key, str(value))
    bad = failed(figures)
    verdict = f"FAILED: {', '.join(bad)} (replay the schedule with --seed {result['seed']})" if bad else "passed"
    notes = [*result["_details"], f"Figures that must be 0: {verdict}."]
    reasons = [f"{k} = {figures[k]}, must be 0 (replay the schedule with --seed {result['seed']})" for k in bad]
    return Report("python -m bench chaos", [table], notes, data={"figures": figures}, failed=reasons)
