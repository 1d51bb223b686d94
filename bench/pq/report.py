"""The tables of ``python -m bench pq``: microseconds per item per class and library (vs persist-queue in the same
run), the 2 + 2 processes' wall (vs persist-queue), the seconds of each phase of their median run, and the
fdatasync floor measured beside them."""

from __future__ import annotations

from typing import Any

from bench.harness import Metric, Report, Table

from .items import FRAME_BYTES, ItemsResult
from .multiprocess import LIBRARIES

REFERENCE = "persist-queue"
PHASES = (
    ("spawn_s", "spawn"),
    ("import_s", "import"),
    ("open_s", "open + 1st call"),
    ("puts_s", "puts"),
    ("records_s", "to last ack"),
    ("tail_s", "idle tail"),
    ("teardown_s", "teardown"),
    ("producers_cpu_s", "CPU producers"),
    ("consumers_cpu_s", "CPU consumers"),
    ("broker_cpu_s", "CPU broker"),
)
COUNTS = (("delivered", "delivered"), ("twice", "twice"), ("lost", "lost"), ("errors", "errors retried"))


def items_tables(result: ItemsResult, n: int) -> list[Table]:
    per_item = Table(
        f"N={n:,} items per class, put then get",
        ("class", "library"),
        (Metric("per item us", higher_is_better=False), Metric("put us", False), Metric("get us", False)),
        (REFERENCE,),
        runs=True,
    )
    for (cls, lib), runs in result.runs.items():
        puts, gets = [p for p, _ in runs], [g for _, g in runs]
        per_item.add(cls, lib, group=cls, per_item_us=[p + g for p, g in runs], put_us=puts, get_us=gets)
    floor = Table(
        f"fdatasync floor: a write of {FRAME_BYTES} B + fdatasync (median of each rep's writes)",
        ("file",),
        (Metric("us", higher_is_better=False),),
        runs=True,
    )
    if result.floor_us:
        floor.add("growing the file", us=result.floor_us["grow"])
        floor.add("into room allocated ahead", us=result.floor_us["ahead"])
    return [per_item, floor]


def multi_tables(runs: dict[str, list[dict[str, Any]]]) -> list[Table]:
    """The wall of each run (vs persist-queue), its counts, and the phases of each library's median run."""
    records = runs[LIBRARIES[0]][0]["records"]
    wall = Table(
        f"2 producers + 2 consumers on one SQLiteAckQueue path, {records:,} records",
        ("library",),
        (Metric("wall s", higher_is_better=False),),
        (REFERENCE,),
        ("records", *(title for _, title in COUNTS)),
        runs=True,
    )
    for lib, rs in runs.items():
        row = wall.add(lib, wall_s=[r["wall_s"] for r in rs])
        row.cells["records"] = f"{rs[0]['records']:,}"
        for key, title in COUNTS:
            row.cells[title] = ", ".join(str(r[key]) for r in rs)
    # which run's phases to show (a text table, no ratio): the one at the median wall, its phases adding up to it
    middle = {lib: sorted(rs, key=lambda r: r["wall_s"])[len(rs) // 2] for lib, rs in runs.items()}
    phases = Table("seconds in the median run of each", ("phase", *middle))
    for key, title in PHASES:
        phases.add(title, *(f"{m[key]:.2f}" for m in middle.values()))
    return [wall, phases]


def pq_report(items: ItemsResult | None, n: int, runs: dict[str, list[dict[str, Any]]] | None) -> Report:
    tables = items_tables(items, n) if items is not None else []
    tables += multi_tables(runs) if runs is not None else []
    data = {"multiprocess": runs} if runs is not None else {}
    return Report("python -m bench pq: persist-queue's API, persist-queue vs persisting.compat", tables, data=data)
