"""bench/'s harness and its suites: the list, each suite's ``--help``, the harness's medians, ratios and rendering,
and a smoke run of each suite at a tiny size (its rows and its reference ratio in the rendered output)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

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
