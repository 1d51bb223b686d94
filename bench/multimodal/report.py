"""The tables of ``python -m bench multimodal``, one set per part: the GRPO step's hand-over, bytes and peak RSS per
system (and what finding the repeats costs against memcpy), the big batch against memcpy, the stream against a
plain file write and the memory it takes."""

from __future__ import annotations

from typing import Any

from bench.harness import Metric, Table

MiB = 1 << 20
GBPS = Metric("GB/s")
PEAK = Metric("peak MiB", higher_is_better=False, digits=4)
GRPO_REFERENCES = ("persisting", "torch.mp.Queue", "TransferQueue")


def grpo_tables(rows: list[dict[str, Any]]) -> tuple[list[Table], list[str]]:
    """The step's table, the hash table, and notes (cases not measured)."""
    logical = rows[0]["logical_bytes"] if rows else 0
    step = Table(
        f"GRPO multimodal step: {logical / MiB:,.0f} MiB as put, 1 producer -> 3 consumer tasks, each its own process",
        ("system",),
        (
            Metric("hand-over s", higher_is_better=False, digits=4),
            Metric("stored MiB", higher_is_better=False, digits=4),
            Metric("stored/put", higher_is_better=False),
            Metric("broker peak RSS MiB", False, 4),
            Metric("producer peak RSS MiB", False, 4),
            Metric("consumer peak RSS MiB", False, 4),
        ),
        GRPO_REFERENCES,
        ("arena MiB",),
        runs=True,
    )
    by_case: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_case.setdefault(row["case"], []).append(row)
    hashes = by_case.pop("hash", [])
    notes = []
    for case, rs in by_case.items():
        ok = [r for r in rs if r.get("error") is None]
        if not ok:
            notes.append(f"{case}: not measured: {rs[0]['error']}")
            continue
        samples: dict[str, Any] = {
            "hand_over_s": [r["handover_s"] for r in ok],
            "stored_MiB": [r["stored_bytes"] / MiB for r in ok],
            "stored_put": [r["stored_bytes"] / logical for r in ok],
            "producer_peak_RSS_MiB": [r["producer_rss"] / MiB for r in ok],
            "consumer_peak_RSS_MiB": [r["consumer_rss"] / MiB for r in ok],
        }
        if "broker_rss" in ok[0]:
            samples["broker_peak_RSS_MiB"] = [r["broker_rss"] / MiB for r in ok]
        step.add(case, **samples).cells["arena MiB"] = str(ok[0].get("arena_mib", "-"))
    notes.append(
        "Bytes stored: persisting's Lance files of the step after a flush; torch and TransferQueue: the bytes they "
        "hold by design (every sample's tensors as put), not measured. Peak RSS: VmHWM, with the shared memory in it "
        "(the arena's pages a process mapped, one copy for all of them; torch's shared tensors; the JSON output has "
        "Arena: the broker's first shared-memory segment; more grow within its budget."
    )
    return [step, *_hash_table(hashes)], notes


def _hash_table(hashes: list[dict[str, Any]]) -> list[Table]:
    if not hashes:
        return []
    n = hashes[0]["n"]
    table = Table(
        f"Finding the repeats: the step's {n / MiB:,.0f} MiB of images in the producer, against a memcpy of them",
        ("what",),
        (GBPS,),
        ("memcpy",),
        runs=True,
    )
    table.add("xxh3-128 of each sample (dedup's default)", GB_s=[n / r["hash_s"] / 1e9 for r in hashes])
    table.add(
        "and every repeat's bytes compared (PERSISTING_DEDUP_VERIFY=1)", GB_s=[n / r["verify_s"] / 1e9 for r in hashes]
    )
    table.add("memcpy", GB_s=[n / r["copy_s"] / 1e9 for r in hashes])
    return [table]


def big_tables(rows: list[dict[str, Any]]) -> tuple[list[Table], list[str]]:
    flushed = bool(rows[0]["after_flush"])
    gib, arena = rows[0]["bytes"] / 1024**3, rows[0]["arena_bytes"] / MiB
    speed = Table(f"One {gib:.2f} GiB float32 batch through a {arena:.0f} MiB arena, producer -> consumer process",
                  ("what",), (GBPS,), ("memcpy",), runs=True)  # fmt: skip
    whole = "put -> flush -> consumer holds it all" if flushed else "put -> consumer holds it all"
    get = "get alone (after the flush: from Lance)" if flushed else "get alone (after the put: from the spool file)"
    speed.add("memcpy", GB_s=[r["memcpy_gbps"] for r in rows])
    speed.add(whole, GB_s=[r["gbps"] for r in rows])
    speed.add("put alone (acknowledged)", GB_s=[r["put_gbps"] for r in rows])
    speed.add(get, GB_s=[r["get_gbps"] for r in rows])
    memory = Table(f"Peak RSS (the batch is {gib * 1024:,.0f} MiB)", ("process",), (PEAK,), runs=True)
    memory.add("broker", peak_MiB=[r["broker_peak_rss"] / MiB for r in rows])
    memory.add("consumer (its one result tensor is the one copy it needs)",
               peak_MiB=[r["consumer_peak_rss"] / MiB for r in rows])  # fmt: skip
    if flushed:
        memory.add("broker during the get alone, as it began", peak_MiB=[r["broker_get_start_rss"] / MiB for r in rows])
        memory.add("broker during the get alone, at most", peak_MiB=[r["broker_get_peak_rss"] / MiB for r in rows])
    exact = all(r["exact"] for r in rows)
    return [speed, memory], [f"big: every byte checked: {'exact' if exact else 'FAILED, bytes differ'}"]


def stream_tables(rows: list[dict[str, Any]]) -> tuple[list[Table], list[str]]:
    stream = [r for r in rows if r["part"] == "stream"]
    memory = [r for r in rows if r["part"] == "stream-memory"]
    arena = rows[0]["arena_bytes"]
    tables = []
    if stream:
        table = Table(
            f"Sustained stream of {stream[0]['bytes'] / 1e9:.2f} GB ({stream[0]['bytes'] / arena:.0f}x the "
            f"{arena / MiB:.0f} MiB arena) into Lance through the broker; the file reference just before each case",
            ("encoders", "what"),
            (GBPS, Metric("broker CPU cores used", higher_is_better=False)),
            ("file write + fdatasync",),
            runs=True,
        )
        for n in sorted({r["encoders"] for r in stream}):
            case = [r for r in stream if r["encoders"] == n]
            table.add(str(n), "persisting", group=str(n), GB_s=[r["gbps"] for r in case],
                      broker_CPU_cores_used=[r["broker_cores"] for r in case])  # fmt: skip
            table.add(str(n), "file write + fdatasync", group=str(n), GB_s=[r["disk_gbps"] for r in case])
        tables.append(table)
    notes = []
    if memory:
        mem = Table(
            f"Memory while 1 producer streams {memory[0]['bytes'] / 1e9:.2f} GB ({memory[0]['bytes'] / arena:.0f}x "
            f"the {arena / MiB:,.0f} MiB arena) to 3 consumer processes",
            ("what",),
            (PEAK, Metric("beyond the arena MiB", higher_is_better=False, digits=4)),
            runs=True,
        )
        for key, label in (("arena_most_used", "arena bytes in use"), ("broker_peak_rss", "broker RSS"),
                           ("producer_peak_rss", "producer RSS"),
                           ("consumer_peak_rss", "consumer RSS (the largest of 3)")):  # fmt: skip
            mem.add(label, peak_MiB=[r[key] / MiB for r in memory],
                    beyond_the_arena_MiB=[(r[key] - arena) / MiB for r in memory])  # fmt: skip
        speed = Table("The memory run's speed", ("what",), (GBPS,), runs=True)
        speed.add("1 producer -> 3 consumers", GB_s=[r["gbps"] for r in memory])
        tables += [mem, speed]
        notes.append(f"stream: every consumer took every batch: {all(r['all_taken'] for r in memory)}")
    return tables, notes
