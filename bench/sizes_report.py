"""The report of ``python -m bench sizes`` (bench/sizes.py): one row per size and system (and the bound of one
memcpy plus one ``hello``), the steady stream, the aims of issue 31 against what was measured, and the series the
``--plot`` chart draws."""

from __future__ import annotations

import statistics

from .layout import AIM_HEADERS, Section, aims_json, closing_notes, page, report_json
from .sizes import SYSTEMS, Case, MiB, SizesResult, label

BROKER = "broker peak, MiB: RSS (shm / file / anon)"
ONE_HEADERS: tuple[str, ...] = (
    "size",
    "system",
    "GB/s (median)",
    "runs, GB/s",
    "first (cold), GB/s",
    "put returned, ms",
)
ONE_HEADERS += ("vs torch.mp", "vs memcpy", "consumer held, MiB", BROKER)
STREAM_HEADERS = ("stream", "system", "GB/s", "vs torch.mp", "vs memcpy", "consumer held, MiB", BROKER)
BOUND = "bound: 1 memcpy + 1 hello"


def _x(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else ""


def _gb(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}" if v < 1 else f"{v:.2f}"


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f}" if n else ""


def _broker(c: Case) -> str:
    rss, *parts = (f"{n / MiB:,.0f}" for n in c.broker)
    return f"{rss} ({' / '.join(parts)})" if c.broker[0] else ""


def hello_s(result: SizesResult) -> float:
    return statistics.median(result.hello_us) / 1e6 if result.hello_us else 0.0


def bound_gbps(result: SizesResult, nbytes: int) -> float | None:
    """The fastest a hand-over of one copy and one round trip could go at this size, in this run."""
    memcpy = result.case("memcpy", nbytes)
    if memcpy is None or not memcpy.runs_s:
        return None
    return nbytes / (statistics.median(memcpy.runs_s) + hello_s(result)) / 1e9


def sizes_of(result: SizesResult, mode: str = "one") -> list[int]:
    return sorted({c.nbytes for c in result.cases if c.mode == mode})


def _one_rows(result: SizesResult, nbytes: int) -> list[list[str]]:
    torch, memcpy = (result.case(s, nbytes) for s in ("torch.mp", "memcpy"))
    t, m = (c.gbps if c else None for c in (torch, memcpy))
    rows = []
    for c in (result.case(s, nbytes) for s in (*SYSTEMS, "memcpy")):
        if c is None:
            continue
        runs = ", ".join(_gb(nbytes / s / 1e9) for s in c.runs_s)
        first = _gb(nbytes / c.first_s / 1e9) if c.first_s else ""
        vs_t = _x(c.gbps, t) if c.system == "persisting" else ""
        put = f"{statistics.median(c.put_s) * 1e3:,.1f}" if c.put_s else ""
        rows.append([label(nbytes), c.system, _gb(c.gbps), runs, first, put, vs_t, _x(c.gbps, m), _mib(c.held)])
        rows[-1].append(_broker(c))
    bound = bound_gbps(result, nbytes)
    rows.append([label(nbytes), BOUND, _gb(bound), "", "", "", "", _x(bound, m), "", ""])
    return rows


def _stream_rows(result: SizesResult) -> list[list[str]]:
    rows = []
    for nbytes in sizes_of(result, "stream"):
        torch, memcpy = (result.case(s, nbytes, "stream") for s in ("torch.mp", "memcpy"))
        t, m = (c.gbps if c else None for c in (torch, memcpy))
        for c in (result.case(s, nbytes, "stream") for s in (*SYSTEMS, "memcpy")):
            if c is not None:
                what = f"{c.batches} x {label(nbytes)}" if c.system != "memcpy" else f"one {label(nbytes)} batch"
                vs_t = _x(c.gbps, t) if c.system == "persisting" else ""
                rows.append([what, c.system, _gb(c.gbps), vs_t, _x(c.gbps, m), _mib(c.held), _broker(c)])
    return rows


def budget_bytes(result: SizesResult) -> int:
    """The broker's shared memory as its ``hello`` names it: a budget where it names one, else the arena's size."""
    mem = result.broker_memory
    return int(next((v for k, v in mem.items() if "budget" in k), mem.get("size_bytes", 0)))


def aim_rows(result: SizesResult) -> list[list[str]]:
    rows = []

    def aim(what: str, a: float | None, b: float | None, target: float | None) -> None:
        if a and b:
            met = "-" if target is None else "yes" if a / b >= target else "no"
            rows.append([what, f"{a / b:.2f}x", f">= {target:g}x" if target else "shown", met])

    for nbytes in sizes_of(result):
        p, t, m = (c.gbps if c else None for c in (result.case(s, nbytes) for s in (*SYSTEMS, "memcpy")))
        aim(f"{label(nbytes)}: persisting / torch.mp", p, t, 2.0)
        if nbytes >= 64 * MiB:
            aim(f"{label(nbytes)}: persisting / memcpy", p, m, 0.5)
        else:
            aim(f"{label(nbytes)}: persisting / {BOUND}", p, bound_gbps(result, nbytes), None)
    for nbytes in sizes_of(result, "stream"):
        p, m = (c.gbps if c else None for c in (result.case(s, nbytes, "stream") for s in ("persisting", "memcpy")))
        aim(f"stream of {label(nbytes)} batches: persisting / memcpy", p, m, 0.7)
    return rows + _memory_rows(result)


def _memory_rows(result: SizesResult) -> list[list[str]]:
    persisting = [c for c in result.cases if c.system == "persisting" and c.broker[0]]
    if not persisting:
        return []
    budget = budget_bytes(result)
    shm, file, anon = (_most(persisting, k) for k in (1, 2, 3))
    within = "yes" if shm.broker[1] <= budget else "no"
    rows = [
        [f"broker's shared memory (peak RssShmem; hello: {label(budget)})", _at(shm, 1), f"<= {label(budget)}", within],
        ["broker's file pages mapped (peak RssFile)", _at(file, 2), "a constant", "-"],
        ["broker's own memory (peak RssAnon)", _at(anon, 3), "a constant", "-"],
    ]
    held = [c.held / c.nbytes for c in result.cases if c.system != "memcpy" and c.nbytes >= 64 * MiB and c.held]
    if held:
        ok = "yes" if max(held) <= 1.05 else "no"
        rows.append(["consumer peak above its base / batch, >= 64 MiB", f"{min(held):.2f}-{max(held):.2f}x", "1x", ok])
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
    return notes + closing_notes(result.wall_s, result.broker_log)


def render_sizes(result: SizesResult, fmt: str) -> str:
    aims = aim_rows(result)
    if fmt == "json":
        return report_json(
            result,
            cases=result.to_json(),
            hello_us_p50=hello_s(result) * 1e6,
            skipped=result.skipped,
            aims=aims_json(aims),
        )
    one = [row for n in sizes_of(result) for row in _one_rows(result, n)]
    stream = _stream_rows(result)
    sections = [
        Section("One batch, producer process -> consumer process", ONE_HEADERS, one) if one else None,
        Section("Steady stream", STREAM_HEADERS, stream) if stream else None,
        Section("Aims (issue 31)", AIM_HEADERS, aims) if aims else None,
        Section("Notes", lines=_notes(result)),
    ]
    return page(fmt, "Sizes benchmark", result.meta, sections)


def plot_series(result: SizesResult) -> dict[str, list[tuple[int, float]]]:
    """GB/s by size, one line per system (and the bound), for ``plots.plot_sizes``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for nbytes in sizes_of(result):
        for system in (*SYSTEMS, "memcpy"):
            c = result.case(system, nbytes)
            if c is not None and c.gbps:
                out.setdefault(system, []).append((nbytes, c.gbps))
        bound = bound_gbps(result, nbytes)
        if bound:
            out.setdefault(BOUND, []).append((nbytes, bound))
    return out
