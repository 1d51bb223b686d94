"""The ``broker`` benchmark's report: a BrokerBenchResult as console tables, reStructuredText, or JSON."""

from __future__ import annotations

import os

from bench.broker.latency import LatencySeries
from bench.broker.throughput import PIPELINED_INFLIGHT, Throughput
from bench.broker.workload import BrokerBenchResult
from bench.common.sections import AIM_HEADERS, Section, Sections, aims_json, as_report, closing_notes
from bench.harness import Metric, Report, Table

from .chart import plot_broker

FLOOR = "zmq-raw"
THROUGHPUT_HEADERS = (
    "store",
    "key",
    "records",
    "produced rec/s",
    "consumed rec/s",
    "produce s",
    "consume s",
    "consumed",
    "duplicates",
    "lost",
    "left",
    "order",
    "broker CPU s",
)

SYNC_P50_AIM_US = 1_000.0
# issue 22's aims
PROCESS_RATIO_AIM = 2.0
HELLO_RATIO_AIM = 1.3
THROUGHPUT_AIM = 100_000.0


P50 = Metric("p50 us", higher_is_better=False, digits=4, quantile=0.5)
P99 = Metric("p99 us", higher_is_better=False, digits=4, quantile=0.99)
MAX = Metric("max us", higher_is_better=False, digits=4, quantile=1.0)


def latency_table(result: BrokerBenchResult) -> Table:
    """One row per series; p50, p99 and max of its calls, and p50 against the raw ZeroMQ echo's."""
    table = Table("Round trip of one record", ("series", "key"), (P50, P99, MAX), (FLOOR,), ("requests", "mean us"))
    table.plain_ratio = True  # as the aims read it: this p50 / the floor's, above 1 slower
    for s in result.latency:
        row = table.add(s.label, s.key)
        row.samples = {P50.name: s.samples_us, P99.name: s.samples_us, MAX.name: s.samples_us}
        row.cells = {"requests": f"{len(s.samples_us):,}", "mean us": f"{s.mean_us:.1f}"}
    return table


def throughput_cells(t: Throughput) -> list[str]:
    return [
        t.label,
        t.key,
        f"{t.target:,}",
        f"{t.produce_rate:,.0f}",
        f"{t.consume_rate:,.0f}",
        f"{t.produce_s:.2f}",
        f"{t.consume_s:.2f}",
        f"{t.consumed:,}",
        f"{t.duplicates:,}",
        f"{t.lost:,}",
        f"{t.left:,}",
        "-" if t.order_ok is None else "ok" if t.order_ok else "BROKEN",
        "-" if t.broker_cpu_s is None else f"{t.broker_cpu_s:.2f}",
    ]


# Aim verdicts (a ratio against issue 22's threshold, met or not), which the harness's tables do not hold.
def aims(result: BrokerBenchResult) -> list[list[str]]:
    return _latency_aims(result) + _throughput_aims(result)


def _p50_row(what: str, series: LatencySeries, under: LatencySeries, aim: float | None) -> list[str]:
    """``series`` p50 over ``under`` p50 against an aim (None: a row that shows where the time goes)."""
    ratio = series.p50_us / under.p50_us
    measured = f"{ratio:.2f}x ({series.p50_us:.0f} / {under.p50_us:.0f} us)"
    if aim is None:
        return [what, measured, "-", "-"]
    return [what, measured, f"<= {aim:g}x", "yes" if ratio <= aim else "NO"]


def _latency_aims(result: BrokerBenchResult) -> list[list[str]]:
    floor, on_loop = result.series(FLOOR), result.series("zmq-raw-loop-server")
    planned: list[tuple[str, str, LatencySeries | None, float | None]] = [
        ("hello p50 / raw ZMQ p50", "broker-hello", floor, HELLO_RATIO_AIM),
        # Rows with no aim: where a ratio's time goes (each against a floor measured in the same run). The floor
        # of a client on asyncio: issue 22 accepts it where the blocking echo's ratio is out of reach.
        ("hello p50 / the loop-read raw echo p50 (the asyncio floor)", "broker-hello", result.series("zmq-loop"), None),
        # what an event-loop server pays to wake, with no request handled
        ("raw echo served on a loop (the broker's serving, no work) / raw ZMQ p50", "zmq-raw-loop-server", floor, None),
        ("hello from a bare socket (no client code) / the loop-served echo p50", "raw-hello", on_loop, None),
        ("hello p50, blocking caller / the loop-served echo p50", "blocking-hello", on_loop, None),
        (
            'put p50, durability="process", blocking caller / the loop-served echo p50',
            "blocking-put-process",
            on_loop,
            None,
        ),
        ("hello p50, blocking caller (SyncQueue's path) / raw ZMQ p50", "blocking-hello", floor, HELLO_RATIO_AIM),
        (
            'put p50, durability="process", blocking caller / raw ZMQ p50',
            "blocking-put-process",
            floor,
            PROCESS_RATIO_AIM,
        ),
        ('put p50, durability="process" / raw ZMQ p50', "put-process", floor, PROCESS_RATIO_AIM),
    ]
    out = []
    for what, key, under, aim in planned:
        series = result.series(key)
        if series is not None and under is not None:
            out.append(_p50_row(what, series, under, aim))
    sync = result.series("put-sync")
    if sync is not None:
        met = "yes" if sync.p50_us < SYNC_P50_AIM_US else "NO"
        out.append(
            ['put p50, durability="sync" (absolute)', f"{sync.p50_us:.0f} us", f"< {SYNC_P50_AIM_US:,.0f} us", met]
        )
    return out


def _throughput_aims(result: BrokerBenchResult) -> list[list[str]]:
    out = []
    rates = {t.key: t.consume_rate for t in result.throughput}
    for suffix in ("", f"-pipelined-{PIPELINED_INFLIGHT}"):
        sync_rate, process_rate = rates.get(f"persisting-sync{suffix}"), rates.get(f"persisting-process{suffix}")
        if sync_rate and process_rate is not None:
            out.append(
                [
                    f"2x2{suffix.replace('-', ' ')} consumed records/s, process / sync",
                    f"{process_rate / sync_rate:.2f}x ({process_rate:,.0f} / {sync_rate:,.0f})",
                    ">= 1x",
                    "yes" if process_rate >= sync_rate else "NO",
                ]
            )
    for t in result.throughput:
        if t.key in ("persisting-sync", f"persisting-sync-pipelined-{PIPELINED_INFLIGHT}"):
            out += _durable_rows(t)
    return out


def _durable_rows(t: Throughput) -> list[list[str]]:
    cores = os.cpu_count() or 1
    rate = min(t.produce_rate, t.consume_rate)
    clean = t.duplicates == 0 and t.lost == 0 and not t.errors
    what = f"2x2 durable (sync){t.key[len('persisting-sync') :].replace('-', ' ')}"
    out = [
        [
            f"{what} records/s, min(produced, consumed)",
            f"{rate:,.0f}" + ("" if clean else " (with errors, see notes)"),
            f">= {THROUGHPUT_AIM:,.0f}",
            "yes" if rate >= THROUGHPUT_AIM and clean else "NO",
        ]
    ]
    per = t.cpu_us_per_record
    if per:
        # The floor the issue asks for where an aim is out of reach: this code's CPU per record, measured in the
        # same run, bounds any rate on this machine's cores.
        ceiling = cores * 1e6 / per
        out.append(
            [
                f"{what}: CPU per record (broker + 4 clients) and the {cores}-core ceiling it allows",
                f"{per:.1f} us; ceiling {ceiling:,.0f} records/s; run at {rate / ceiling:.2f}x it",
                "-",
                "-",
            ]
        )
    return out


def _settings_lines(result: BrokerBenchResult) -> list[str]:
    lines = [f"{s.key}: {s.label}, {s.settings}" for s in result.latency]
    lines += [f"{t.key}: {t.label}, {t.settings}" for t in result.throughput]
    return lines


def _notes(result: BrokerBenchResult) -> list[str]:
    s = result.settings
    notes = [
        f"Latency: {s['latency_n']:,} sequential requests per series after {s['warmup']:,} warm-up requests, the "
        "eleven series interleaved in 8 rounds; one ~100-byte record per request; p50/p99 nearest rank. "
        f"vs {FLOOR} = this p50 / the blocking raw echo's p50 (above 1: slower).",
        "Throughput: produced rec/s = records acknowledged / (earliest worker start -> last producer done); "
        "consumed rec/s = distinct records read / (earliest worker start -> last record read). lost = acknowledged "
        "but never read (nor left in the queue); left = still in the queue after the run; order = each producer's "
        "records read back in the order it wrote them. broker CPU s = the broker process's user+system CPU time "
        "over the run (from /proc).",
    ]
    for t in result.throughput:
        for e in t.errors:
            notes.append(f"{t.key} ERROR: {e}")
        for n in t.notes:
            notes.append(f"{t.key}: {n}")
    clean = "" if result.broker_exit == 0 else " (NOT a clean exit)"
    notes.append(
        f"Broker stop (SIGTERM; it flushes its topics): {result.broker_stop_s:.2f} s, exit code {result.broker_exit}"
        f"{clean}."
    )
    what = "Broker log lines at WARNING or above (or checks that failed)"
    return notes + closing_notes(result.broker_log, what)


def broker_report(result: BrokerBenchResult) -> Report:
    floor = result.series(FLOOR)
    tp_rows = [throughput_cells(t) for t in result.throughput]
    aim_rows = aims(result)
    sections: list[Section | Table | None] = [
        latency_table(result),
        Section("2 producers x 2 consumers", THROUGHPUT_HEADERS, tp_rows) if tp_rows else None,
        Section("Aims", AIM_HEADERS, aim_rows) if aim_rows else None,
        Section("Settings", lines=_settings_lines(result)),
        Section("Notes", lines=_notes(result)),
    ]
    latency = []
    for s in result.latency:
        row = s.to_json()
        row["p50_vs_raw_zmq"] = s.p50_us / floor.p50_us if floor is not None else None
        latency.append(row)
    data = {
        "settings": result.settings,
        "latency": latency,
        "throughput": [t.to_json() for t in result.throughput],
        "aims": aims_json(aim_rows),
        "broker_stop_s": result.broker_stop_s,
        "broker_exit": result.broker_exit,
        "broker_log": result.broker_log,
    }
    charts = Sections(data=data, wall_s=result.wall_s, charts=lambda folder, sub: plot_broker(result, folder, sub))
    return as_report("Broker benchmark", sections, charts)
