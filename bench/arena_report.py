"""The ``arena`` benchmark's report: an ArenaBenchResult as console tables, reStructuredText, or JSON."""

from __future__ import annotations

from .arena_batches import LARGE, POOL, SMALL, MiB
from .arena_pair import ArenaBenchResult, Row
from .layout import AIM_HEADERS, Section, aims_json, closing_notes, page, report_json

STREAM_AIM_GBPS = 1.5
HANDOVER_AIM_MS = 1.0

HEADERS = (
    "path",
    "mode",
    "batch",
    "batches",
    "GB/s",
    "vs memcpy",
    "hand-over p50 ms",
    "p99 ms",
    "from put start p50 ms",
    "copied",
    "key",
)


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def cells(r: Row) -> list[str]:
    ratio = f"{r.gbps / r.memcpy_gbps:.2f}x" if r.memcpy_gbps else "-"
    size = f"{r.batch_bytes / MiB:g} MiB"
    return [
        r.path,
        r.mode,
        size,
        f"{r.received:,}" + ("" if r.received == r.batches else f" of {r.batches:,}"),
        f"{r.gbps:.2f}",
        ratio,
        _fmt_ms(r.p(0.5)),
        _fmt_ms(r.p(0.99)),
        _fmt_ms(r.p(0.5, r.from_start_ms)),
        "-" if r.copied_bytes is None else f"{r.copied_bytes / (r.received * r.batch_bytes or 1):.0%}",
        r.key,
    ]


def aims(result: ArenaBenchResult) -> list[list[str]]:
    out = []
    s = result.row(f"arena-{SMALL.key}-stream")
    if s is not None:
        ok = s.gbps >= STREAM_AIM_GBPS and not s.errors and s.received == s.batches
        out.append(
            [
                f"sustained GB/s, {SMALL.batch_bytes / MiB:g} MiB batches, stream (within the arena)",
                f"{s.gbps:.2f} GB/s",
                f">= {STREAM_AIM_GBPS:g} GB/s",
                "met" if ok else "NO",
            ]
        )
    for mode in ("paced", "stream"):
        r = result.row(f"arena-{LARGE.key}-{mode}")
        p50 = r.p(0.5) if r is not None else None
        if r is not None and p50 is not None:
            out.append(
                [
                    f"hand-over p50, {LARGE.batch_bytes / MiB:g} MiB batches, {mode}",
                    f"{p50:.2f} ms",
                    f"< {HANDOVER_AIM_MS:g} ms",
                    "met" if p50 < HANDOVER_AIM_MS and not r.errors else "NO",
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
        'persisting: durability="process" (the log is written, not fsynced; the background flush writes the rows to '
        "Lance meanwhile, competing for the same cores and the disk). An extent is reused only after its rows are "
        "flushed and no consumer holds views, so beyond the arena size throughput is bound by the flush (disk).",
        "persisting arena reserve: the producer reserve()s each batch in the arena, np.copyto's its pool batch into "
        "the reserved arrays (its one write, standing in for a GPU->host copy straight into shared memory) and "
        "put()s the reservation, which copies nothing; 'from put start' starts before reserve(), so it includes "
        "that write.",
        "TransferQueue: not measured (not installable here).",
    ]
    for r in result.rows:
        notes += [f"{r.key}: {r.path}, {r.settings}"]
        notes += [f"{r.key} ERROR: {e}" for e in r.errors]
        notes += [f"{r.key}: {n}" for n in r.notes]
    return notes + closing_notes(result.wall_s, result.broker_log)


def render_arena(result: ArenaBenchResult, fmt: str) -> str:
    if fmt == "json":
        return report_json(
            result,
            rows=[r.to_json() for r in result.rows],
            aims=aims_json(aims(result)),
            zero_copy_checks=result.checks,
            broker_log=result.broker_log,
        )
    aim_rows = aims(result)
    sections = [
        Section("Producer -> consumer", HEADERS, [cells(r) for r in result.rows]),
        Section("Aims", AIM_HEADERS, aim_rows) if aim_rows else None,
        Section("Zero-copy check", lines=result.checks, console=[f"zero-copy check, {c}" for c in result.checks]),
        Section("Notes", lines=_notes(result)),
    ]
    return page(fmt, "Arena benchmark", result.meta, sections)
