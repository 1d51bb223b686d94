"""The ``persisting-broker`` subprocess a benchmark runs against: start it, wait for its ready line, stop it, and
read what it left (its log, its CPU time)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from persisting.tensors.arena import default_path


@contextlib.contextmanager
def broker_process(
    storage: Path, address: str, log_path: Path, extra: Sequence[str] = (), log_level: str = "INFO"
) -> Iterator[subprocess.Popen[bytes]]:
    """``persisting-broker`` on ``storage``/``address`` (plus ``extra`` flags), up once it printed its ready line;
    SIGTERM on exit. Its stderr is appended to ``log_path``."""
    cmd = [sys.executable, "-m", "broker", "--storage-path", str(storage), "--socket", address]
    cmd += ["--log-level", log_level, *extra]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
    try:
        _await_ready(proc, deadline=time.monotonic() + 60)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                default_path(storage).unlink(missing_ok=True)  # a killed broker leaves its arena for a restart
        if proc.stdout is not None:
            proc.stdout.close()


def _await_ready(proc: subprocess.Popen[bytes], deadline: float) -> None:
    out = proc.stdout
    if out is None:
        raise RuntimeError("broker started without a stdout pipe")
    seen = b""
    while b"\n" not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            raise RuntimeError(f"persisting-broker did not get ready (exit {proc.poll()}); stdout so far: {seen!r}")
        ready, _, _ = select.select([out], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                continue
            seen += chunk
    if b"persisting-broker ready on" not in seen:
        raise RuntimeError(f"unexpected first line from persisting-broker: {seen!r}")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far, from /proc (None: unknown, e.g. not Linux)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on: "pid (comm) " may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def log_lines(log_path: Path) -> list[str]:
    """The non-blank lines of a broker log (run at ``--log-level WARNING``: everything in it is worth a note)."""
    if not log_path.exists():
        return []
    return [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
