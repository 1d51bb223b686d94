"""bench/'s harness and its suites: the list, each suite's ``--help``, the harness's medians, ratios, rendering and
exit status, and a smoke run at a tiny size (its rows and its reference ratio in the rendered output) of queue,
broker, samples, persist, imports and verl. The other suites' smoke runs are in test_bench_tensor_suites.py,
test_bench_ray_suites.py, test_bench_suites_second.py and test_chaos.py: files of about equal time, so that
``pytest --dist loadfile`` spreads them over its workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import Metric, Report, Table, cli, discover
from bench.harness.render import render

from .bench_run import bench, bench_json, rows_by, rows_in_groups, smoke

ROOT = Path(__file__).resolve().parent.parent


def test_python_m_bench_lists_every_suite_and_probe_one_line_each() -> None:
    out = bench().stdout
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


def test_the_harness_renders_console_md_andbench_json() -> None:
    report = Report("Title", [_table()], ["a note"])
    console = render(report, {"command": "c"}, "console")
    assert "GB/s (median)" in console and "2.00x" in console and "a note" in console
    md = render(report, {"command": "c"}, "md")
    assert md.startswith("## Title") and "| size | system | GB/s (median) | ms | vs ref |" in md
    data = json.loads(render(report, {"command": "c"}, "json"))
    assert data["tables"][0]["rows"][0]["vs"] == {"ref": 2.0}
    assert data["tables"][0]["rows"][0]["value"]["GB/s"] == 3.0


def test_a_report_that_failed_exits_1_with_its_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.chaos.report import MUST_BE_ZERO, chaos_report
    from bench.harness import Suite

    def run(failed: list[str]) -> int:
        suite = Suite("t", "a suite that fails", lambda ctx: Report("t", [_table()], failed=failed), reps=1)
        return cli.run_suite(suite, ["t", "--no-progress", "--dir", str(tmp_path), "--format", "json"])

    assert run([]) == 0
    assert json.loads(capsys.readouterr().out)["failed"] == []
    assert run(["acknowledged lost = 2, must be 0"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["failed"] == ["acknowledged lost = 2, must be 0"]
    assert "python -m bench t: failed: acknowledged lost = 2, must be 0" in err
    # chaos says its run failed when a figure that must be 0 is not
    figures = dict.fromkeys(MUST_BE_ZERO, 0) | {"seed": 7, "_details": []}
    assert chaos_report(figures).failed == []
    (reason,) = chaos_report(figures | {"acknowledged lost": 1}).failed
    assert reason.startswith("acknowledged lost = 1, must be 0") and "--seed 7" in reason


def test_the_harness_draws_each_measured_table_without_suite_charts(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench.harness.render import default_charts

    (path,) = default_charts(Report("A title", [_table(), Table("text only", ("a",))]), "run", tmp_path)
    assert path.name == "a_title_1.png" and path.stat().st_size > 0


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


def test_queue_smoke(tmp_path: Path) -> None:
    data = bench_json("queue", "--n", "300", "--flush-prefill", "1000", "--flush-reps", "2", "--dir", str(tmp_path))
    write_read, flush, settings = data["tables"]
    rows = rows_by(write_read, "settings")
    assert {"persisting-sync", "persisting-process", "sqlite-batch", "file"} <= set(rows)
    assert rows["persisting-process"]["vs"]["sqlite-batch"] > 0 and "sqlite-batch" not in rows["sqlite-batch"]["vs"]
    assert set(rows_by(flush, "topic")) == {"empty", "full"} and rows_by(flush, "topic")["full"]["vs"]["empty"] > 0
    assert data["reference"] == "sqlite-batch" and settings["rows"]


def test_broker_smoke(tmp_path: Path) -> None:
    args = ["broker", "--latency-n", "20", "--warmup", "2", "--records", "200", "--durability", "process"]
    data = bench_json(*args, "--pq-records", "0", "--dir", str(tmp_path))
    latency, throughput, _aims = data["tables"]
    series = {r["labels"]["key"]: r for r in latency["rows"]}
    assert len(series) == 11 and series["put-process"]["vs"]["zmq-raw"] > 0 and not series["zmq-raw"]["vs"]
    # the harness's p50 is the nearest-rank p50 the suite reports for the same calls
    assert (
        series["put-process"]["value"]["p50 us"]
        == next(s for s in data["latency"] if s["key"] == "put-process")["p50_us"]
    )
    assert [t["key"] for t in data["throughput"]] == ["persisting-process", "persisting-process-pipelined-4"]
    assert throughput["rows"] and data["broker_exit"] == 0


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
    data = bench_json(*args)
    latency = data["tables"][0]
    series = {r["labels"]["series"]: r for r in latency["rows"]}
    get_meta = next(r for name, r in series.items() if name.startswith("get_meta 16") and "idle broker" in name)
    assert latency["heading"] == "Latency" and get_meta["vs"]["hello"] > 0
    assert "not measured (--no-transferqueue)" in series["TransferQueue 0.1.11 get_meta"]["cells"]["note"]
    assert data["workload"]["correct"] == "yes" and not data["errors"]


def test_persist_smoke(tmp_path: Path) -> None:
    args = ["persist", "--arena-mib", "16", "--stream-factor", "1", "--encoders", "1", "--table-mib", "2"]
    data = bench_json(*args, "--flush-prefill", "1000", "--reps", "1", "--dir", str(tmp_path))
    stream, encoding, flush = data["tables"]
    one = rows_by(stream, "encoders")["1"]
    assert one["vs"]["disk"] > 0 and one["value"]["GB/s"] > 0
    assert set(rows_by(encoding, "column metadata")) == {"default", "compression=none"}
    assert rows_by(flush, "topic")["full (1,000 rows)"]["vs"]["empty"] > 0


def test_imports_smoke(tmp_path: Path) -> None:
    data = bench_json("imports", "--reps", "1", "--dir", str(tmp_path))
    rows = rows_by(data["tables"][0], "statement")
    assert rows["import persisting"]["vs"]["import persistqueue"] > 0
    assert rows["import persisting"]["value"]["import s"] > 0


@pytest.mark.parametrize("name", ["arena-steps", "broker-steps", "client-steps", "samples-cpu"])
def test_each_probe_parses_its_flags(name: str) -> None:
    probe = discover.probes()[name]
    assert probe.parser().prog == f"python -m bench {name}"
    help_text = bench(name, "--help").stdout
    assert help_text.startswith("usage: python -m bench " + name)


def test_verl() -> None:
    """Both backends, one rollout worker each (TransferQueue's own Ray cluster is most of the time)."""
    pytest.importorskip("tensordict")
    args = ["--workers", "1", "--steps", "1", "--prompts", "2", "--n", "2", "--dp", "1"]
    data = smoke("verl", *args)
    steps, rss = data["tables"]
    rows = rows_in_groups(steps, "backend")
    missing = any(note.startswith("TransferQueue not measured") for note in data["notes"])
    backends = {"persisting"} if missing else {"persisting", "transferqueue"}
    assert set(rows) == {f"{p} / {b}" for p in ("time per step", "rollout puts", "trainer's part") for b in backends}
    if "transferqueue" in backends:
        assert rows["time per step / persisting"]["vs"]["transferqueue"] > 0
    assert "all processes / persisting" in rows_in_groups(rss, "backend")
