"""What a suite's run returns: a ``Report`` of ``Table``s of ``Row``s, each row's samples per rep, and the rows it
is compared with in the same run (its references). The harness takes the medians and the ratios here, once, for
every suite."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Metric:
    """A measured column: ``name`` carries its unit ("GB/s", "write s"); ``higher_is_better`` orients the ratios
    (a ratio above 1 always means better than the reference); ``digits``: significant digits shown; ``quantile``:
    None for the median of the samples (one per rep), else the nearest-rank quantile (0 < q <= 1) of them, for a
    row whose samples are many calls timed within one run ("p50 us", "p99 us")."""

    name: str
    higher_is_better: bool = True
    digits: int = 3
    quantile: float | None = None

    def of(self, samples: Sequence[float]) -> float | None:
        """This metric's figure of ``samples`` (None: no samples)."""
        if not samples:
            return None
        if self.quantile is None:
            return statistics.median(samples)
        ordered = sorted(samples)
        return ordered[max(0, math.ceil(self.quantile * len(ordered)) - 1)]


@dataclass(slots=True)
class Row:
    """One measured thing: its ``labels`` (one cell per ``Table.labels``), its ``samples`` (metric name -> one
    value per rep; a metric measured once is a list of one), text ``cells`` for ``Table.extra`` columns, and the
    ``group`` of rows it is compared with (e.g. one batch size): references are looked up within it. ``key`` is
    the name references use (default: the last label)."""

    labels: Sequence[str]
    samples: dict[str, list[float]] = field(default_factory=dict)
    cells: dict[str, str] = field(default_factory=dict)
    group: str = ""
    key: str = ""

    @property
    def name(self) -> str:
        return self.key or (self.labels[-1] if self.labels else "")

    def median(self, metric: str) -> float | None:
        values = self.samples.get(metric)
        return statistics.median(values) if values else None


@dataclass(slots=True)
class Table:
    """Rows with their references. Columns: ``labels``, the figure of each of ``metrics``, with ``runs`` a column
    listing every rep's value of the first metric, one ``vs KEY`` column per key in ``references`` (the ratio of
    the first metric's figures to the row named KEY in the same group, oriented by ``higher_is_better``), then
    ``extra`` text columns. ``plain_ratio``: the ratios are the figures as they are, mine / the reference's (a cost
    against its baseline: above 1 costs more), whatever ``higher_is_better`` says. A table without metrics is text
    only: ``labels`` are its headers."""

    heading: str
    labels: Sequence[str]
    metrics: Sequence[Metric] = ()
    references: Sequence[str] = ()
    extra: Sequence[str] = ()
    rows: list[Row] = field(default_factory=list)
    runs: bool = False
    plain_ratio: bool = False

    def add(self, *labels: str, group: str = "", key: str = "", **samples: list[float]) -> Row:
        """A row of ``labels`` with ``samples`` (keyword: the metric's name with spaces and slashes as ``_``)."""
        names = {_kw(m.name): m.name for m in self.metrics}
        unknown = set(samples) - set(names)
        if unknown:
            raise KeyError(f"table {self.heading!r} has no metric {sorted(unknown)}; its metrics: {sorted(names)}")
        row = Row(labels, {names[k]: v for k, v in samples.items()}, group=group, key=key)
        self.rows.append(row)
        return row

    def value(self, row: Row, metric: Metric) -> float | None:
        return metric.of(row.samples.get(metric.name, ()))

    def reference(self, row: Row, key: str) -> Row | None:
        return next((r for r in self.rows if r.group == row.group and r.name == key), None)

    def ratio(self, row: Row, key: str) -> float | None:
        """``row``'s first metric against the row named ``key`` in its group, above 1: better (None: not both)."""
        ref = self.reference(row, key)
        if ref is None or ref is row or not self.metrics:
            return None
        metric = self.metrics[0]
        mine, theirs = self.value(row, metric), self.value(ref, metric)
        if not mine or not theirs:
            return None
        return mine / theirs if metric.higher_is_better or self.plain_ratio else theirs / mine

    def headers(self) -> list[str]:
        out = [*self.labels]
        for i, m in enumerate(self.metrics):
            median = m.quantile is None and i == 0 and any(self._reps())
            out.append(f"{m.name} (median)" if median else m.name)
            if i == 0 and self.runs:
                out.append(f"runs, {m.name}")
        return out + [f"vs {key}" for key in self.references] + [*self.extra]

    def cells(self, row: Row) -> list[str]:
        out = list(row.labels)
        for i, m in enumerate(self.metrics):
            out.append(number(self.value(row, m), m.digits))
            if i == 0 and self.runs:
                out.append(", ".join(number(v, m.digits) for v in row.samples.get(m.name, ())))
        out += [times(self.ratio(row, key)) for key in self.references]
        return out + [row.cells.get(name, "") for name in self.extra]

    def _reps(self) -> list[bool]:
        """Per row: whether its first metric has several samples (then its column is a median)."""
        first = self.metrics[0].name if self.metrics else ""
        return [len(r.samples.get(first, ())) > 1 for r in self.rows]

    def to_json(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            entry: dict[str, Any] = {"labels": dict(zip(self.labels, r.labels, strict=False)), "group": r.group}
            entry["value"] = {m.name: self.value(r, m) for m in self.metrics if m.name in r.samples}
            # samples of a quantile metric are many calls: the figures stand for them
            many = {m.name for m in self.metrics if m.quantile is not None}
            entry["samples"] = {k: v for k, v in r.samples.items() if k not in many}
            entry["vs"] = {key: self.ratio(r, key) for key in self.references if self.ratio(r, key) is not None}
            rows.append({**entry, **({"cells": r.cells} if r.cells else {})})
        return {"heading": self.heading, "rows": rows}


@dataclass(slots=True)
class Report:
    """A suite's result: ``tables`` in order, ``notes`` (lines after them), ``meta`` (what the run's metadata adds:
    the records, the broker's command...), ``data`` (more JSON fields), ``charts`` (for ``--plot``: writes the
    suite's own PNGs to a folder, the run's label under each, and returns their paths; None: the harness draws
    each measured table), ``wall_s`` (set by the harness when left 0), ``failed``: why the run failed, one reason
    each (a figure that must be 0 is not): ``python -m bench`` then prints them on stderr and exits 1, so that a
    user or CI sees it without reading the tables."""

    title: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    charts: Callable[[Path, str], list[Path]] | None = None
    wall_s: float = 0.0
    failed: list[str] = field(default_factory=list)


def number(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, thousands separated, no exponent ("" for None)."""
    if value is None:
        return ""
    if value == 0 or abs(value) >= 10 ** (digits - 1) or float(value).is_integer():
        return f"{value:,.0f}"
    decimals = max(0, digits - 1 - _magnitude(abs(value)))
    return f"{value:,.{decimals}f}"


def times(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def _magnitude(value: float) -> int:
    return math.floor(math.log10(value))


def _kw(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")
