"""``persisting-broker --help`` explains every option in words a user reads (issue 33): no option without help,
no source path in place of an explanation, and each setting's flag says what it does and its default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker.__main__ import make_parser
from broker.settings import SETTINGS, settings

ROOT = Path(__file__).resolve().parent.parent


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_option_has_help_in_words() -> None:
    actions = [a for a in make_parser()._actions if a.dest != "help"]
    for action in actions:
        name = action.option_strings[0] if action.option_strings else action.dest
        text = action.help or ""
        assert len(text.split()) >= 6, f"{name} has no help worth the name: {text!r}"
        # a path into the source is not an explanation (``--json`` once said "keys: broker/status.py")
        assert not re.search(r"\w+/\w+\.py\b", text), f"{name} points at the source: {text!r}"
    flags = {a.dest for a in actions if a.option_strings}
    assert set(SETTINGS) <= flags  # every setting of the broker has a flag, so a help text


@pytest.mark.parametrize("setting", ["storage_path", "max_message_bytes", "log_level", "arena_bytes", "socket"])
def test_each_setting_says_its_default(setting: str) -> None:
    (action,) = [a for a in make_parser()._actions if a.dest == setting]
    assert "default" in (action.help or ""), action.help


def test_the_command_prints_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broker", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    shown = _words(done.stdout)
    for action in make_parser()._actions:
        assert _words(action.help or "") in shown
    assert "--storage-path PATH folder that holds the topics' data" in shown
    assert "status.py" not in shown


def test_a_log_level_that_does_not_exist_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="log_level must be one of DEBUG, INFO"):
        settings(make_parser().parse_args(["--log-level", "loud"]))
    assert settings(make_parser().parse_args(["--log-level", "debug"]))["log_level"] == "debug"


def test_byte_settings_take_units_and_the_budget_holds_the_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PERSISTING_SHM_BUDGET", "PERSISTING_ARENA_BYTES", "PERSISTING_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    conf = settings(make_parser().parse_args(["--shm-budget", "8G", "--arena-bytes", "512M"]))
    assert (conf["shm_budget"], conf["arena_bytes"]) == (8 << 30, 512 << 20)
    assert settings(make_parser().parse_args(["--shm-budget", "1.5GiB"]))["shm_budget"] == 3 << 29
    assert settings(make_parser().parse_args([]))["shm_budget"] is None  # derived from the machine at start
    monkeypatch.setenv("PERSISTING_SHM_BUDGET", "2048")
    assert settings(make_parser().parse_args(["--arena-bytes", "1024"]))["shm_budget"] == 2048
    with pytest.raises(SystemExit, match="shm_budget must be a byte count such as"):
        settings(make_parser().parse_args(["--shm-budget", "lots"]))
    with pytest.raises(SystemExit, match="must be at least arena_bytes"):
        settings(make_parser().parse_args(["--shm-budget", "1M", "--arena-bytes", "2M"]))


def test_the_default_budget_follows_the_machine(tmp_path: Path) -> None:
    from broker.segments import default_budget

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    budget = default_budget(1 << 20, tmp_path)
    st = os.statvfs(tmp_path)  # (other tests write meanwhile: the free space moves a little)
    assert budget <= ram * 0.3 and abs(budget - min(ram * 0.3, st.f_bavail * st.f_frsize * 0.5)) < 256 << 20
    assert default_budget(1 << 50, tmp_path) == 1 << 50  # never below the arena
