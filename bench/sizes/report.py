"""The report of ``python -m bench sizes`` (bench/sizes/workload.py): one row per size and system (and the bound of
one memcpy plus one ``hello``), the steady stream, the aims of issue 31 against what was measured, and the chart."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from bench.harness import Metric, Report, Row, Table
from bench.harness.plots import pyplot, save

from .worker import ROWS
from .workload import SYSTEMS, Case, MiB, SizesResult, label

BROKER = "broker peak, MiB: RSS (shm / file / anon)"
HELD = "consumer held, MiB"
AIM_HEADERS = ("aim", "measured", "target", "met")
GBPS = Metric("GB/s")
FIRST = Metric("first (cold), GB/s")
PUT = Metric("put returned, ms", higher_is_better=False, digits=4)
REFERENCES = ("torch.mp", "memcpy")
BOUND = "bound: 1 memcpy + 1 hello"


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f}" if n else ""


def _broker(c: Case) -> str:
    rss, *parts = (f"{n / MiB:,.0f}" for n in c.broker)
    return f"{rss} ({' / '.join(parts)})" if c.broker[0] else ""


def hello_s(result: SizesResult) -> float:
    return statistics.median(result.hello_us) / 1e6 if result.hello_us else 0.0


def sizes_of(result: SizesResult, mode: str = "one") -> list[int]:
    return sorted({c.nbytes for c in result.cases if c.mode == mode})


def _gbps(nbytes: int, seconds: list[float]) -> list[float]:
    return [nbytes / s / 1e9 for s in seconds if s > 0]


def one_table(result: SizesResult) -> Table:
    """Per size: each system's GB/s per rep, the bound (the median memcpy plus the median hello, per size)."""
    table = Table(
        "One batch, producer process -> consumer process",
        ("size", "system"),
        (GBPS, FIRST, PUT),
        REFERENCES,
        (HELD, BROKER),
        runs=True,
    )
    for nbytes in sizes_of(result):
        size = label(nbytes)
        for c in (result.case(s, nbytes) for s in (*SYSTEMS, "memcpy")):
            if c is None:
                continue
            row = table.add(size, c.system, group=size, GB_s=_gbps(nbytes, c.runs_s))
            if c.first_s:
                row.samples[FIRST.name] = _gbps(nbytes, [c.first_s])
            if c.put_s:
                row.samples[PUT.name] = [s * 1e3 for s in c.put_s]
            row.cells = {HELD: _mib(c.held), BROKER: _broker(c)}
        memcpy = result.case("memcpy", nbytes)
        if memcpy is not None and memcpy.runs_s:
            bound = nbytes / (statistics.median(memcpy.runs_s) + hello_s(result)) / 1e9
            table.add(size, BOUND, group=size, key="bound", GB_s=[bound])
    return table


def stream_table(result: SizesResult) -> Table:
    table = Table("Steady stream", ("stream", "system"), (GBPS,), REFERENCES, (HELD, BROKER))
    for nbytes in sizes_of(result, "stream"):
        for c in (result.case(s, nbytes, "stream") for s in (*SYSTEMS, "memcpy")):
            if c is not None:
                what = f"{c.batches} x {label(nbytes)}" if c.system != "memcpy" else f"one {label(nbytes)} batch"
                row = table.add(what, c.system, group=label(nbytes), GB_s=_gbps(nbytes * c.batches, c.runs_s))
                row.cells = {HELD: _mib(c.held), BROKER: _broker(c)}
    return table


def budget_bytes(result: SizesResult) -> int:
    """The broker's shared memory as its ``hello`` names it: a budget where it names one, else the arena's size."""
    mem = result.broker_memory
    return int(next((v for k, v in mem.items() if "budget" in k), mem.get("size_bytes", 0)))


def aim_table(result: SizesResult, one: Table, stream: Table) -> Table:
    """The aims of issue 31, from the harness's ratios of the tables above."""
    table = Table("Aims (issue 31)", AIM_HEADERS)

    def aim(what: str, t: Table, group: str, key: str, target: float | None) -> None:
        row = next((r for r in t.rows if r.group == group and r.name == "persisting"), None)
        ratio = None if row is None else t.ratio(row, key)
        if ratio is not None:
            met = "-" if target is None else "yes" if ratio >= target else "no"
            table.rows.append(Row((what, f"{ratio:.2f}x", f">= {target:g}x" if target else "shown", met)))

    for nbytes in sizes_of(result):
        size = label(nbytes)
        aim(f"{size}: persisting / torch.mp", one, size, "torch.mp", 2.0)
        if nbytes >= 64 * MiB:
            aim(f"{size}: persisting / memcpy", one, size, "memcpy", 0.5)
        else:
            aim(f"{size}: persisting / {BOUND}", one, size, "bound", None)
    for nbytes in sizes_of(result, "stream"):
        aim(f"stream of {label(nbytes)} batches: persisting / memcpy", stream, label(nbytes), "memcpy", 0.7)
    table.rows += [Row(cells) for cells in _memory_rows(result)]
    return table


def _memory_rows(result: SizesResult) -> list[tuple[str, ...]]:
    persisting = [c for c in result.cases if c.system == "persisting" and c.broker[0]]
    if not persisting:
        return []
    budget = budget_bytes(result)
    shm, file, anon = (_most(persisting, k) for k in (1, 2, 3))
    within = "yes" if shm.broker[1] <= budget else "no"
    rows: list[tuple[str, ...]] = [
        (f"broker's shared memory (peak RssShmem; hello: {label(budget)})", _at(shm, 1), f"<= {label(budget)}", within),
        ("broker's file pages mapped (peak RssFile)", _at(file, 2), "a constant", "-"),
        ("broker's own memory (peak RssAnon)", _at(anon, 3), "a constant", "-"),
    ]
    held = [c.held / c.nbytes for c in result.cases if c.system != "memcpy" and c.nbytes >= 64 * MiB and c.held]
    if held:
        ok = "yes" if max(held) <= 1.05 else "no"
        rows.append(("consumer peak above its base / batch, >= 64 MiB", f"{min(held):.2f}-{max(held):.2f}x", "1x", ok))
    return rows


def _most(cases: list[Case], k: int) -> Case:
    return max(cases, key=lambda c: c.broker[k])


def _at(c: Case, k: int) -> str:
    where = f"{c.batches} x {label(c.nbytes)}" if c.mode == "stream" else label(c.nbytes)
    return f"{c.broker[k] / MiB:,.0f} MiB ({where})"


def _notes(result: SizesResult) -> list[str]:
    notes = []
    if result.hello_us:
        notes.append(
            f"protocol hello, blocking caller: p50 {hello_s(result) * 1e6:,.0f} us ({len(result.hello_us)} calls)"
        )
    notes += result.skipped
    if result.broker_log:
        notes += [f"broker log lines at WARNING or above: {len(result.broker_log)}"]
        notes += [f"  {line}" for line in result.broker_log[:10]]
    return notes


def sizes_report(result: SizesResult) -> Report:
    one, stream = one_table(result), stream_table(result)
    return Report(
        "Sizes benchmark",
        [one, stream, aim_table(result, one, stream)],
        _notes(result),
        meta={
            "records": f"one field x: a torch uint8 tensor of {ROWS} samples (size / {ROWS} bytes each)",
            "broker": "python -m broker --storage-path <work dir>/storage --socket ipc://<work dir>/s/b.sock "
            "--log-level WARNING (defaults otherwise)",
            "broker shared memory (hello)": result.broker_memory,
        },
        data={"cases": [{**asdict(c), "gbps": c.gbps} for c in result.cases], "hello_us_p50": hello_s(result) * 1e6},
        charts=lambda folder, subtitle: [chart(one, folder, subtitle)],
        wall_s=result.wall_s,
    )


def chart(one: Table, folder: Path, subtitle: str) -> Path:
    """GB/s against the batch size (log x), one line per system (the bound, a dashed line)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in one.rows:
        gbps = row.median(GBPS.name)
        if gbps:
            series.setdefault(row.labels[1], []).append((_bytes(row.group), gbps))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for system, points in series.items():
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(xs, ys, "--" if system.startswith("bound") else "-", marker="o", ms=3.5, label=system)
    ticks = sorted({n for points in series.values() for n, _ in points})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ticks, [f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB" for n in ticks], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("one batch, producer process -> consumer process (every page touched)")
    ax.set_ylabel("GB/s (median, log scale)")
    ax.set_title("Hand-over speed by batch size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, folder, "sizes_gbps.png", subtitle)


def _bytes(size_label: str) -> float:
    number, unit = size_label.split()
    return float(number.replace(",", "")) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}.get(unit, 1)
