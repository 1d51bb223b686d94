"""A smoke run of pq, storage, verl-dedup, lance-read-apis, lance-read-cpu, lance-encoding and wal-rounds, and of
the probes (dedup-lifetime, arena-steps, broker-steps, client-steps, samples-cpu), at a tiny size through
``python -m bench`` in a subprocess (they spawn workers and brokers): the rendered JSON holds each suite's rows
and, where it has one, its same-run reference ratio (the other suites': tests/test_bench_suites.py says where).
verl's packages are installed by ``./dev test``; without them the suites that need them are skipped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .bench_run import ROOT, bench, rows_in_groups, smoke


def test_pq() -> None:
    pytest.importorskip("persistqueue")
    data = smoke("pq", "--n", "20", "--mp-n", "20", "--mp-repeat", "1")
    items, floor, wall, phases = data["tables"]
    rows = rows_in_groups(items, "library")
    assert len(rows) == 15  # 5 classes x persist-queue and the two durabilities
    assert set(rows["SQLiteAckQueue / persisting durability=sync"]["vs"]) == {"persist-queue"}
    assert rows["SQLiteAckQueue / persisting durability=sync"]["value"]["per item us"] > 0
    assert len(floor["rows"]) == 2
    ours = rows_in_groups(wall, "library")["persisting"]
    assert ours["vs"]["persist-queue"] > 0 and ours["cells"]["lost"] == "0" and ours["cells"]["twice"] == "0"
    assert len(phases["rows"]) == 10


def test_storage() -> None:
    pytest.importorskip("moto")
    data = smoke("storage", "--records", "100", "--tensors", "2", "--tensor-kib", "4")
    for table in data["tables"]:  # flush, read
        rows = rows_in_groups(table, "store")
        s3 = [r for name, r in rows.items() if "S3" in name]
        assert len(rows) == 4 and len(s3) == 2
        assert all(set(r["vs"]) == {"local disk"} and r["vs"]["local disk"] > 0 for r in s3)


def test_verl_dedup() -> None:
    pytest.importorskip("tensordict")
    args = ["--steps", "1", "--prompts", "2", "--n", "2", "--image-mib", "0.25", "--shapes", "multimodal"]
    data = smoke("verl-dedup", *args)
    step, disk = data["tables"]
    assert rows_in_groups(step, "dedup")["multimodal / auto"]["vs"]["off"] > 0
    deduped = rows_in_groups(disk, "dedup")["multimodal / auto"]
    assert deduped["vs"]["off"] > 1  # each image stored once of its n=2 copies
    assert deduped["value"]["stored MiB"] < deduped["value"]["deduped put MiB"]


def test_lance_read_apis() -> None:
    data = smoke("lance-read-apis", "--gib", "0.0625")
    rows = rows_in_groups(data["tables"][0], "read")
    assert len(rows) == 5 and rows["LanceFragment.to_batches"]["vs"]["plain read of the data files"] > 0


def test_lance_read_cpu() -> None:
    data = smoke("lance-read-cpu", "--gib", "0.0625", "--arena-mib", "16")
    cpu, speed = data["tables"]
    assert set(rows_in_groups(cpu, "figure")) == {"broker", "consumer", "total"}
    assert speed["rows"][0]["value"]["GB/s"] > 0


def test_lance_encoding() -> None:
    data = smoke("lance-encoding", "--mib", "1")
    writes, typed, pieces = data["tables"]
    assert len(writes["rows"]) == 24 and len(typed["rows"]) == 4 and len(pieces["rows"]) == 3
    assert {r["labels"]["keeps it"] for r in typed["rows"] if r["labels"]["format"] == "stable"} == {"yes"}


def test_wal_rounds() -> None:
    data = smoke("wal-rounds", "--commits", "20")
    rows = data["tables"][0]["rows"]
    assert len(rows) == 8
    ratios = [r["vs"]["asyncio.to_thread at 5 ms"] for r in rows if r["vs"]]
    assert len(ratios) == 6 and all(x > 0 for x in ratios)  # the two reference rows have none


def test_dedup_lifetime_probe() -> None:
    args = ["dedup-lifetime", "--steps", "2", "--open-samples", "256", "--open-repeats", "1", "--reps", "1"]
    out = subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["put", "clear", "open"] and all("ratio" in x for x in lines)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["arena-steps", "--batches", "8"], "put minus its copy and its round trip"),
        (["broker-steps", "--chunk", "50", "--chunks", "2"], "hello                broker CPU per request"),
        (["client-steps", "--chunk", "50", "--chunks", "2"], "SyncQueue.put over the bare socket"),
        (["samples-cpu", "--reps", "1"], "take / count"),
    ],
)
def test_each_probe_runs_at_a_tiny_size(args: list[str], says: str) -> None:
    """The probes behind the pages' figures (a few seconds each): they run, and print the line the pages quote."""
    out = bench(*args).stdout
    assert says in out, out[-2000:]
