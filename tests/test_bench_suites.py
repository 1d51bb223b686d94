"""bench/'s harness and its suites: the list, each suite's ``--help``, the harness's medians, ratios and rendering,
and a smoke run of each suite at a tiny size (its rows and its reference ratio in the rendered output)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.harness import Metric, Report, Table, cli, discover
from bench.harness.render import render

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_python_m_bench_lists_every_suite_and_probe_one_line_each() -> None:
    out = _bench().stdout
    names = [*discover.suites(), *discover.probes()]
    assert "sizes" in names
    for name in names:
        assert sum(line.split()[:1] == [name] for line in out.splitlines()) == 1, (name, out)


@pytest.mark.parametrize("name", sorted(discover.suites()))
def test_each_suite_has_help_and_the_common_flags(name: str) -> None:
    help_text = cli.parser(discover.suites()[name]).format_help()
    for flag in ("--reps", "--dir", "--seed", "--format", "--plot", "--no-progress"):
        assert flag in help_text, (name, flag)


def _table() -> Table:
    table = Table("t", ("size", "system"), (Metric("GB/s"), Metric("ms", higher_is_better=False)), ("ref",))
    table.add("1 MiB", "mine", group="1", GB_s=[1.0, 4.0, 3.0], ms=[2.0])
    table.add("1 MiB", "ref", group="1", GB_s=[1.0, 1.5, 2.0], ms=[4.0])
    table.add("2 MiB", "mine", group="2", GB_s=[9.0])  # no reference in its group: no ratio
    return table


def test_the_harness_takes_medians_and_same_group_ratios() -> None:
    table = _table()
    mine, ref, alone = table.rows
    assert mine.median("GB/s") == 3.0 and table.ratio(mine, "ref") == 2.0
    assert table.ratio(ref, "ref") is None and table.ratio(alone, "ref") is None
    slow = Table("t", ("system",), (Metric("s", higher_is_better=False),), ("ref",))
    row = slow.add("mine", s=[4.0])
    slow.add("ref", s=[2.0])
    assert slow.ratio(row, "ref") == 0.5  # lower is better: half as fast as the reference
    with pytest.raises(KeyError, match="no metric"):
        table.add("x", "y", nope=[1.0])


def test_the_harness_renders_console_md_and_json() -> None:
    report = Report("Title", [_table()], ["a note"])
    console = render(report, {"command": "c"}, "console")
    assert "GB/s (median)" in console and "2.00x" in console and "a note" in console
    md = render(report, {"command": "c"}, "md")
    assert md.startswith("## Title") and "| size | system | GB/s (median) | ms | vs ref |" in md
    data = json.loads(render(report, {"command": "c"}, "json"))
    assert data["tables"][0]["rows"][0]["vs"] == {"ref": 2.0}
    assert data["tables"][0]["rows"][0]["median"]["GB/s"] == 3.0


def test_a_bad_argument_exits_with_usage() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "sizes", "--sizes", "1Q", "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "not a size: '1Q'" in out.stderr, out.stderr


def test_a_suite_that_runs_once_refuses_reps() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "broker", "--reps", "3"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "--reps must be 1: its figures are percentiles" in out.stderr, out.stderr


def test_sizes_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["sizes", "--sizes", "1M,4M", "--reps", "1", "--stream-batches", "2", "--stream-bytes", "4M"]
    args += ["--hellos", "20", "--no-progress", "--dir", str(tmp_path / "work"), "--format", "json"]
    plot = importlib.util.find_spec("matplotlib") is not None
    if plot:
        args += ["--plot", str(tmp_path / "charts")]
    data = json.loads(_bench(*args).stdout)
    one, stream, aims = data["tables"]
    for size in ("1 MiB", "4 MiB"):
        rows = {r["labels"]["system"]: r for r in one["rows"] if r["group"] == size}
        assert set(rows) == {"persisting", "torch.mp", "memcpy", "bound: 1 memcpy + 1 hello"}, rows
        assert rows["persisting"]["median"]["GB/s"] > 0
        assert set(rows["persisting"]["vs"]) == {"torch.mp", "memcpy"}
    assert {r["labels"]["system"] for r in stream["rows"]} == {"persisting", "torch.mp", "memcpy"}
    assert any(r["labels"]["aim"] == "1 MiB: persisting / torch.mp" for r in aims["rows"])
    assert "cpus" in data["meta"] and "persisting revision" in data["meta"]
    assert not any("run stopped" in n for n in data["notes"])
    assert not list((tmp_path / "work").iterdir())  # its work folder removed
    if plot:
        assert (tmp_path / "charts" / "sizes_gbps.png").stat().st_size > 0


def _json(*args: str, timeout: float = 180) -> dict[str, Any]:
    return json.loads(_bench(*args, "--no-progress", "--format", "json", timeout=timeout).stdout)


def _rows(table: dict[str, Any], column: str) -> dict[str, dict[str, Any]]:
    return {r["labels"][column]: r for r in table["rows"]}


def test_queue_smoke(tmp_path: Path) -> None:
    data = _json("queue", "--n", "300", "--flush-prefill", "1000", "--flush-reps", "2", "--dir", str(tmp_path))
    write_read, flush, settings = data["tables"]
    rows = _rows(write_read, "settings")
    assert {"persisting-sync", "persisting-process", "sqlite-batch", "file"} <= set(rows)
    assert rows["persisting-process"]["vs"]["sqlite-batch"] > 0 and "sqlite-batch" not in rows["sqlite-batch"]["vs"]
    assert set(_rows(flush, "topic")) == {"empty", "full"} and _rows(flush, "topic")["full"]["vs"]["empty"] > 0
    assert data["reference"] == "sqlite-batch" and settings["rows"]


def test_broker_smoke(tmp_path: Path) -> None:
    args = ["broker", "--latency-n", "20", "--warmup", "2", "--records", "200", "--durability", "process"]
    data = _json(*args, "--pq-records", "0", "--dir", str(tmp_path))
    latency, throughput, _aims = data["tables"]
    assert len(latency["rows"]) == 11 and "p50 vs raw ZMQ" in latency["rows"][0]["labels"]
    assert any(r["labels"]["p50 vs raw ZMQ"].endswith("x") for r in latency["rows"][1:])
    assert [t["key"] for t in data["throughput"]] == ["persisting-process", "persisting-process-pipelined-4"]
    assert throughput["rows"] and data["broker_exit"] == 0


def test_arena_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["arena", "--small-batches", "4", "--large-batches", "0", "--paced-batches", "0", "--beyond-batches", "0"]
    args += ["--no-transferqueue", "--arena-bytes", str(64 << 20), "--in-flight", "1", "--dir", str(tmp_path)]
    data = _json(*args)
    keys = {r["key"] for r in data["rows"]}
    assert {"memcpy-6MiB", "arena-6MiB-stream", "torch-6MiB-stream"} <= keys, keys
    table = data["tables"][0]
    assert any(v.endswith("x") for r in table["rows"] for k, v in r["labels"].items() if k.startswith("vs memcpy"))


def test_samples_smoke(tmp_path: Path) -> None:
    args = [
        "samples",
        "--puts",
        "2",
        "--latency-n",
        "10",
        "--warmup",
        "1",
        "--no-transferqueue",
        "--dir",
        str(tmp_path),
    ]
    data = _json(*args)
    latency = data["tables"][0]
    assert latency["heading"] == "Latency" and latency["rows"][0]["labels"]["p50 vs hello"] == "1.00x"
    assert data["workload"]["correct"] == "yes" and not data["errors"]


def test_jagged_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    args = ["jagged", "--samples", "4", "--min-len", "4", "--max-len", "16", "--batches", "1", "--reps", "1"]
    data = _json(*args, "--dir", str(tmp_path))
    rows = _rows(data["tables"][0], "case")
    assert set(rows) == {"persisting jagged", "persisting padded", "torch.mp jagged", "torch.mp padded"}
    assert rows["torch.mp padded"]["vs"]["persisting jagged"] > 0 and rows["persisting jagged"]["median"]["ms/batch"]


def test_persist_smoke(tmp_path: Path) -> None:
    args = ["persist", "--arena-mib", "16", "--stream-factor", "1", "--encoders", "1", "--table-mib", "2"]
    data = _json(*args, "--flush-prefill", "1000", "--reps", "1", "--dir", str(tmp_path))
    stream, encoding, flush = data["tables"]
    one = _rows(stream, "encoders")["1"]
    assert one["vs"]["disk"] > 0 and one["median"]["GB/s"] > 0
    assert set(_rows(encoding, "column metadata")) == {"default", "compression=none"}
    assert _rows(flush, "topic")["full (1,000 rows)"]["vs"]["empty"] > 0


def test_imports_smoke(tmp_path: Path) -> None:
    data = _json("imports", "--reps", "1", "--dir", str(tmp_path))
    rows = _rows(data["tables"][0], "statement")
    assert rows["import persisting"]["vs"]["import persistqueue"] > 0
    assert rows["import persisting"]["median"]["import s"] > 0


@pytest.mark.parametrize("name", ["arena-steps", "broker-steps", "client-steps", "samples-cpu"])
def test_each_probe_parses_its_flags(name: str) -> None:
    probe = discover.probes()[name]
    assert probe.parser().prog == f"python -m bench {name}"
    help_text = _bench(name, "--help").stdout
    assert help_text.startswith("usage: python -m bench " + name)
