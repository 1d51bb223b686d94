"""The tables of ``python -m bench storage``: the flush and the read of each workload, MB/s per store, the S3
server against local disk in the same run."""

from __future__ import annotations

from typing import Any

from bench.harness import Metric, Report, Table
from bench.harness.report import number

from .workload import StoreSeries

LOCAL = "local disk"


def _table(step: str, series: list[StoreSeries]) -> Table:
    table = Table(
        f"{step}: payload MB / seconds",
        ("workload", "store"),
        (Metric(f"{step} MB/s"), Metric(f"{step} s", higher_is_better=False, digits=4)),
        (LOCAL,),
        ("rows", "MB"),
        runs=True,
    )
    for s in series:
        seconds = s.flush_s if step == "flush" else s.read_s
        mb = s.payload_bytes / 1e6
        samples: dict[str, Any] = {f"{step}_MB_s": [mb / t for t in seconds], f"{step}_s": seconds}
        row = table.add(s.workload, s.store, group=s.workload, **samples)
        row.cells.update({"rows": f"{s.rows:,}", "MB": number(mb)})
    return table


def storage_report(series: list[StoreSeries]) -> Report:
    notes = [
        "moto keeps objects in its own memory and serves them over HTTP on loopback: the S3 rows show the request "
        "path (HTTP, signing, Lance's object-store I/O), not a real network's or bucket's latency."
    ]
    tables = [_table("flush", series), _table("read", series)]
    return Report("python -m bench storage: a topic on a local S3 server vs local disk", tables, notes)
