"""The systemd unit in systemd/: it verifies, and its ExecStart line, run as a plain process, reaches READY=1.

No systemd manager is needed: ``systemd-analyze verify`` only parses units (skipped where the command is missing),
and the READY check plays systemd's part with a datagram socket of its own as ``$NOTIFY_SOCKET``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.settings import SETTINGS
from persisting.tensors.arena import default_path

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "persisting-broker.service"
ENV_EXAMPLE = ROOT / "systemd" / "broker.env.example"
INSTALLED_BINARY = "/usr/local/bin/persisting-broker"
READY_TIMEOUT = 30.0  # seconds; importing pyarrow and lance dominates on a cold machine
STOP_TIMEOUT = 30.0


def broker_binary() -> str:
    """The console script of the environment running the tests (the venv's ``persisting-broker``)."""
    script = Path(sys.executable).parent / "persisting-broker"
    found = str(script) if script.exists() else shutil.which("persisting-broker")
    if not found:
        pytest.skip("no persisting-broker script; install the package (pip install -e .)")
    return found


def unit_entries(section: str) -> list[tuple[str, str]]:
    """``(key, value)`` pairs of one section, in order (enough for this unit: no line continuations)."""
    entries: list[tuple[str, str]] = []
    current = None
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            continue
        assert not line.endswith("\\"), f"continuation lines are not handled here: {raw!r}"
        key, _, value = line.partition("=")
        if current == section:
            entries.append((key.strip(), value.strip()))
    return entries


def unit_values(key: str) -> list[str]:
    return [value for k, value in unit_entries("Service") if k == key]


def command_line(value: str) -> list[str]:
    """An Exec*= value as argv: drop systemd's prefixes (-, @, +, !, :); this unit uses no specifiers."""
    argv = shlex.split(value.lstrip("-@+!:"))
    assert not any("%" in a or "$" in a for a in argv), f"specifiers or variables are not handled here: {value!r}"
    return argv


def env_file(path: Path) -> dict[str, str]:
    """KEY=value lines of a systemd EnvironmentFile (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=value: {raw!r}"
        out[key.strip()] = value.strip().strip("\"'")
    return out


def commented_env_keys(path: Path) -> set[str]:
    """Keys of the commented-out ``#KEY=value`` examples."""
    keys = set()
    for raw in path.read_text().splitlines():
        line = raw.strip().lstrip("#").strip()
        key, sep, _ = line.partition("=")
        if sep and key.isupper() and " " not in key:
            keys.add(key)
    return keys


def replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    assert flag in argv, f"ExecStart lacks {flag}: {argv}"
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


# -- the unit itself --------------------------------------------------------------------------------------------------


def test_unit_shape() -> None:
    service = dict(unit_entries("Service"))
    assert service["Type"] == "notify"
    assert service["User"] == service["Group"] == "persisting"
    assert "DynamicUser" not in service
    assert service["StateDirectory"] == service["RuntimeDirectory"] == "persisting"
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    argv = command_line(service["ExecStart"])
    assert argv[0] == INSTALLED_BINARY
    assert argv[argv.index("--storage-path") + 1] == "/var/lib/persisting"
    assert argv[argv.index("--socket") + 1] == "ipc:///run/persisting/broker.sock"
    # Options that would give the service its own /dev (and so its own /dev/shm) or remove shared segments.
    for key in ("PrivateDevices", "PrivateIPC", "DevicePolicy", "TemporaryFileSystem", "InaccessiblePaths"):
        assert key not in service, f"{key}= would hide /dev/shm or devices from the broker"
    assert service.get("RemoveIPC", "no") == "no"


def test_env_example_names_real_settings() -> None:
    known = {f"PERSISTING_{key.upper()}" for key in SETTINGS} | {"PERSISTING_CONFIG"}
    # and the engine's and the broker's own tuning variables, read where they are used
    # (engine/flushing.py, broker/tensor_memory.py)
    source = "".join(f.read_text() for package in ("persisting", "broker") for f in (ROOT / package).rglob("*.py"))
    known |= set(re.findall(r'os\.environ\.get\("(PERSISTING_[A-Z_]+)"', source))
    keys = set(env_file(ENV_EXAMPLE)) | commented_env_keys(ENV_EXAMPLE)
    assert keys, "the example sets nothing"
    assert keys <= known, f"unknown settings in {ENV_EXAMPLE.name}: {sorted(keys - known)}"
    assert "EnvironmentFile" in dict(unit_entries("Service"))


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify fails on an ExecStart binary that does not exist, and /usr/local/bin/persisting-broker is not installed
    # on a test machine: check a copy that runs the venv's script instead. User= needs no change (verify does not
    # look the user up).
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace(INSTALLED_BINARY, broker_binary()))

    # Some containers cannot run verify at all; tell that apart from a bad unit with a trivially good one.
    control = tmp_path / "persisting-control.service"
    control.write_text(f"[Service]\nType=oneshot\nExecStart={shutil.which('true') or '/bin/true'}\n")
    checked = _verify(control)
    if checked.returncode != 0:
        pytest.skip(f"systemd-analyze verify does not work here: {(checked.stdout + checked.stderr).strip()}")

    result = _verify(copy)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and unparsable values are only warnings (exit status 0): refuse them too.
    ours = [line for line in output.splitlines() if UNIT.name in line or str(copy) in line]
    assert not ours, "\n".join(ours)


# -- the ExecStart line as a plain process -----------------------------------------------------------------------------


@pytest.fixture
def short_dir(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, unless it is too long for AF_UNIX socket paths (about 107 bytes); then a short temporary folder."""
    if len(str(tmp_path)) < 60:
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="pb-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_exec_start_reaches_ready_and_stops_cleanly(tmp_path: Path, short_dir: Path) -> None:
    storage = tmp_path / "state"
    runtime = short_dir / "run"
    runtime.mkdir(mode=0o750)  # what RuntimeDirectory= gives the service
    sock_file = runtime / "broker.sock"

    # ExecStart, with the installed paths swapped for the test's.
    (exec_start,) = unit_values("ExecStart")
    argv = command_line(exec_start)
    assert argv[0] == INSTALLED_BINARY
    argv[0] = broker_binary()
    argv = replace_flag(argv, "--storage-path", str(storage))
    argv = replace_flag(argv, "--socket", f"ipc://{sock_file}")

    # The environment systemd would build: Environment= lines, then the example file as /etc/persisting/broker.env.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSISTING_")}
    for assignment in unit_values("Environment"):
        for word in shlex.split(assignment):
            key, _, value = word.partition("=")
            env[key] = value
    env.update(env_file(ENV_EXAMPLE))

    notify_path = short_dir / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(0.2)
    env["NOTIFY_SOCKET"] = str(notify_path)

    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with notify, open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            messages = _receive_until(notify, proc, "READY=1", READY_TIMEOUT, err_path)
            assert sock_file.exists(), "READY=1 before the ipc socket exists"
            assert "persisting-broker ready on" in out_path.read_text()

            # ExecStartPost= lines, as systemd runs them after READY=1 (if a drop-in adds any).
            for post in unit_values("ExecStartPost"):
                cmd = [a.replace("/run/persisting/broker.sock", str(sock_file)) for a in command_line(post)]
                subprocess.run(cmd, check=True, timeout=10)
            # The group of client users may connect and map the arena; nobody else may.
            arena = default_path(storage)
            for path in (sock_file, arena):
                mode = stat.S_IMODE(path.stat().st_mode)
                assert mode & 0o060 == 0o060, f"{path.name} mode {mode:o}: the group cannot use it"
                assert mode & 0o007 == 0, f"{path.name} mode {mode:o}: open to everybody"

            proc.send_signal(signal.SIGTERM)
            returncode = proc.wait(timeout=STOP_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert returncode == 0, err_path.read_text()
        assert not sock_file.exists(), "the ipc socket file outlived the broker"
        messages += _drain(notify)
        assert any("STOPPING=1" in m for m in messages), messages


def _receive_until(
    notify: socket.socket, proc: subprocess.Popen[bytes], wanted: str, timeout: float, err_path: Path
) -> list[str]:
    messages: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            messages.append(notify.recv(4096).decode())
        if any(wanted in m.splitlines() for m in messages):
            return messages
        if proc.poll() is not None:
            messages += _drain(notify)
            pytest.fail(f"broker exited {proc.returncode} before {wanted}: {messages}\n{err_path.read_text()}")
    pytest.fail(f"no {wanted} within {timeout}s: {messages}\n{err_path.read_text()}")


def _drain(notify: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(notify.recv(4096).decode())
        except TimeoutError:
            return out
