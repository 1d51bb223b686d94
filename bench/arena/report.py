"""The ``arena`` suite's report: the cases against memcpy of the same batch size, the aims, TransferQueue against
persisting, the zero-copy check, and the notes."""

from __future__ import annotations

from bench.arena.batches import LARGE, POOL, SMALL, MiB
from bench.arena.pair import ArenaBenchResult, Row
from bench.common.sections import AIM_HEADERS, Section, Sections, aims_json, as_report, closing_notes
from bench.harness import Metric, Report, Table

from .chart import plot_arena

HANDOVER_AIM_MS = 1.0

GBPS = Metric("GB/s")
HANDOVER = Metric("hand-over p50 ms", higher_is_better=False, quantile=0.5)
P99 = Metric("p99 ms", higher_is_better=False, quantile=0.99)
FROM_START = Metric("from put start p50 ms", higher_is_better=False, quantile=0.5)
# latency only paced: streaming, it is mostly the backlog a producer runs up ahead of its consumer
PEER_HEADERS = ("ratio", "GB/s", "TransferQueue's from-put-start p50 / persisting's (paced)")


def cases_table(result: ArenaBenchResult) -> Table:
    """One row per case; GB/s against memcpy of the same batch size in this run (the harness's ratio)."""
    table = Table(
        "Producer -> consumer",
        ("path", "mode", "batch", "batches"),
        (GBPS, HANDOVER, P99, FROM_START),
        ("memcpy",),
        ("copied", "key"),
    )
    for r in result.rows:
        size = f"{r.batch_bytes / MiB:g} MiB"
        batches = f"{r.received:,}" + ("" if r.received == r.batches else f" of {r.batches:,}")
        key = "memcpy" if r.key.startswith("memcpy-") else r.key
        row = table.add(r.path, r.mode, size, batches, group=size, key=key)
        row.samples = {GBPS.name: [r.gbps], HANDOVER.name: r.latency_ms, P99.name: r.latency_ms}
        row.samples[FROM_START.name] = r.from_start_ms
        copied = "-" if r.copied_bytes is None else f"{r.copied_bytes / (r.received * r.batch_bytes or 1):.0%}"
        row.cells = {"copied": copied, "key": r.key}
    return table


def _aim(what: str, value: float | None, target: float, unit: str = "x") -> list[str]:
    shown = "-" if value is None else f"{value:.2f}{unit}"
    return [what, shown, f">= {target:g}{unit}", "met" if value is not None and value >= target else "NO"]


def _ratio(a: Row | None, b: Row | None) -> float | None:
    if a is None or b is None or a.errors or a.received != a.batches or not b.gbps:
        return None
    return a.gbps / b.gbps


# Aim verdicts (a ratio against a threshold, met or not), which the harness's tables do not hold; each compares rows
# across modes or with the torch stream, while the cases table compares with memcpy only.
def aims(result: ArenaBenchResult) -> list[list[str]]:
    out = []
    small = f"{SMALL.batch_bytes / MiB:g} MiB"
    large = f"{LARGE.batch_bytes / MiB:g} MiB"
    torch_small = result.row(f"torch-{SMALL.key}-stream")
    n = result.settings.get("in_flight", 1)
    ways = [("arena", "", "persisting", "")]
    if n > 1:  # the same stream with n puts running at once on the producer's Queue
        ways.append(("arena", f"-{n}-in-flight", "persisting", f", {n} puts in flight"))
    for path, tail, label, how in [*ways, ("arena-reserve", "", "persisting reserve", "")]:
        s = result.row(f"{path}-{SMALL.key}-stream{tail}")
        if s is not None:
            if torch_small is not None:
                vs_torch = _ratio(s, torch_small)
                out.append(_aim(f"{label} {small} stream{how} / torch.multiprocessing.Queue", vs_torch, 2.0))
            vs_mem = _ratio(s, result.row(f"memcpy-{SMALL.key}"))
            out.append(_aim(f"{label} {small} stream{how} / memcpy", vs_mem, 0.4))
        big = result.row(f"{path}-{LARGE.key}-stream{tail}")
        if big is not None:
            vs_mem = _ratio(big, result.row(f"memcpy-{LARGE.key}"))
            out.append(_aim(f"{label} {large} stream{how} / memcpy", vs_mem, 0.8))
    beyond = result.row(f"arena-{SMALL.key}-stream-beyond")
    if beyond is not None:
        disk = result.row(f"fdatasync-{SMALL.key}")
        out.append(_aim(f"persisting {small} beyond the arena / file write + fdatasync", _ratio(beyond, disk), 0.7))
    for mode in ("paced", "stream"):
        r = result.row(f"arena-{LARGE.key}-{mode}")
        p50 = r.p(0.5) if r is not None else None
        if r is not None and p50 is not None:
            out.append(
                [
                    f"hand-over p50, {large} batches, {mode}",
                    f"{p50:.2f} ms",
                    f"< {HANDOVER_AIM_MS:g} ms",
                    "met" if p50 < HANDOVER_AIM_MS and not r.errors else "NO",
                ]
            )
    return out


def _tq_note(state: str) -> str:
    if state != "measured":
        return f"TransferQueue 0.1.11: {state}."
    return (
        "TransferQueue 0.1.11 (its rows run last, with Ray up only meanwhile): hand-over = the consumer's get_data "
        "returned (a TensorDict of nested tensors copied out of the storage unit's replies) - the producer's put "
        "returned (insert meta from the controller, the data to the storage unit over TCP, its notice to the "
        "controller); the consumer polls get_meta while the batch is not ready. 'vs TransferQueue' lines: persisting "
        "GB/s / TransferQueue GB/s of the same batch size and mode in this run."
    )


# Kept here: it pairs each persisting row with TransferQueue's of the same batch size and mode, and its second
# figure (paced from-put-start p50) is another metric than the cases table's first, the one its ratios use.
def peer_ratios(result: ArenaBenchResult) -> list[list[str]]:
    """persisting / TransferQueue per batch size and mode measured for both: GB/s, and (paced) the p50 time
    from put called to the consumer holding the batch."""
    out = []
    for shape in (SMALL, LARGE):
        for mode in ("stream", "paced"):
            a, t = result.row(f"arena-{shape.key}-{mode}"), result.row(f"tq-{shape.key}-{mode}")
            gbps = _ratio(a, t)
            if a is None or t is None or gbps is None or t.errors:
                continue
            pa, pt = a.p(0.5, a.from_start_ms), t.p(0.5, t.from_start_ms)
            out.append(
                [
                    f"persisting arena / TransferQueue, {shape.batch_bytes / MiB:g} MiB {mode}",
                    f"{gbps:.1f}x",
                    "-" if mode != "paced" or pa is None or pt is None or pa <= 0 else f"{pt / pa:.1f}x",
                ]
            )
    return out


def _notes(result: ArenaBenchResult) -> list[str]:
    s = result.settings
    notes = [
        "copied = share of the bytes the persisting consumer got as copies (read back from Lance) instead of "
        "views on the arena.",
        "GB/s = bytes received / (producer's first put starts -> consumer has the last batch), 1 GB = 1e9 bytes; "
        "vs memcpy = that / memcpy GB/s of the same batch size in this run (one copy, one thread: the arena path "
        "makes one copy too, in the producer, plus the protocol; both processes and the broker share the cores).",
        "hand-over = consumer has the batch (persisting: get_data returned the views; torch: get() returned the "
        "tensors) - the producer's put returned (persisting: after its one copy into the arena and the put_tensors "
        "round trip; torch: after the copy into shared memory, before the feeder thread pickles and sends). "
        "Per batch, aligned by batch order, time.monotonic across processes; p50/p99 nearest rank. In stream mode "
        "it includes waiting behind earlier batches; paced mode puts batch i once batch i-1 was received. A negative "
        "hand-over means the consumer had the batch before the producer's put returned (the broker makes the samples "
        "visible before its put_tensors reply reaches the producer). 'from put start' measures from the moment put "
        "was called instead (includes the producer's copy into shared memory).",
        f"Every batch is checked on receipt: its first element carries the batch number (order and content). Source "
        f"data: {POOL} random batches per producer (numpy default_rng(seed={s['seed']})), used in turn.",
        'persisting: durability="process" (the log is written, not fsynced). Arena batches are written behind: the '
        "flush to Lance starts when the topic is quiet, when the oldest batch waited 5 s, or when 3/4 of the arena "
        "waits for it; an extent is reused only after its rows are flushed and no consumer holds views, so beyond "
        "the arena size throughput is bound by the flush (Lance's write of typed columns, then fsync), which the "
        "'file write + fdatasync' row bounds from above (the same bytes, no encoding).",
        "persisting arena reserve: the producer reserve()s each batch in the arena, np.copyto's its pool batch into "
        "the reserved arrays (its one write, standing in for a GPU->host copy straight into shared memory) and "
        "put()s the reservation, which copies nothing; 'from put start' starts before reserve(), so it includes "
        "that write.",
        _tq_note(s.get("transferqueue", "not measured")),
    ]
    for r in result.rows:
        notes += [f"{r.key}: {r.path}, {r.settings}"]
        notes += [f"{r.key} ERROR: {e}" for e in r.errors]
        notes += [f"{r.key}: {n}" for n in r.notes]
    return notes + closing_notes(result.broker_log)


def arena_report(result: ArenaBenchResult) -> Report:
    aim_rows = aims(result)
    peer = peer_ratios(result)
    sections: list[Section | Table | None] = [
        cases_table(result),
        Section("Aims", AIM_HEADERS, aim_rows) if aim_rows else None,
        Section("Against TransferQueue", PEER_HEADERS, peer) if peer else None,
        Section("zero-copy check", lines=result.checks),
        Section("Notes", lines=_notes(result)),
    ]
    data = {
        "settings": result.settings,
        "rows": [r.to_json() for r in result.rows],
        "aims": aims_json(aim_rows),
        "vs_transferqueue": [dict(zip(PEER_HEADERS, r, strict=True)) for r in peer],
        "zero_copy_checks": result.checks,
        "broker_log": result.broker_log,
    }
    charts = Sections(data=data, wall_s=result.wall_s, charts=lambda folder, sub: plot_arena(result, folder, sub))
    return as_report("Arena benchmark", sections, charts)
