"""Start the real broker as a subprocess for tests (wait for its ready line; stop with SIGTERM)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from persisting.tensors.arena import default_path, leftover_segments


@dataclass
class BrokerProcess:
    storage: Path
    address: str
    proc: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None  # the broker's log (stderr) goes here, appended, instead of a pipe
    preexec: Callable[[], None] | None = None  # runs in the child before the broker starts (resource limits)

    def start(self, timeout: float = 20.0) -> float:
        """Start and wait for the ready line; returns seconds to ready."""
        t0 = time.monotonic()
        log = None if self.log_path is None else self.log_path.open("ab")
        extra = list(self.extra_args)
        if "--arena-bytes" in extra and "--shm-budget" not in extra:
            # A test that sizes the arena tests what a full one does (backpressure, Full, the spool path): its
            # budget is the arena, as the tests were written. tests/test_segments.py tests the growth beyond it.
            extra += ["--shm-budget", extra[extra.index("--arena-bytes") + 1]]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker",
                "--storage-path",
                str(self.storage),
                "--socket",
                self.address,
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if log is None else log,
            bufsize=0,
            preexec_fn=self.preexec,
        )
        if log is not None:
            log.close()  # the child has its own copy
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if b"ready" not in line:
            err = self.proc.stderr.read() if self.proc.stderr else b""
            raise AssertionError(f"broker did not start: {line!r} {err.decode()[-2000:]}")
        return time.monotonic() - t0

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.stderr = err.decode() if err is not None else self.log_path.read_text() if self.log_path else ""
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def ensure_dead(self) -> None:
        """Teardown: never leave a broker running after a test, whatever happened in it, nor the arena file a
        killed broker leaves for its next start (a clean stop removes its own; tests check that before this)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=30)
        default_path(self.storage).unlink(missing_ok=True)
        for left in leftover_segments(default_path(self.storage)):
            left.unlink(missing_ok=True)
        sock = Path(self.address[len("ipc://") :])
        sock.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            sock.parent.rmdir()


def make_broker(tmp_path: Path) -> BrokerProcess:
    # ipc paths are limited to ~107 bytes: keep the socket short
    sock_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"pb-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    sock_dir.mkdir(mode=0o700)
    return BrokerProcess(tmp_path / "data", f"ipc://{sock_dir}/b.sock")


@contextlib.contextmanager
def running_broker(tmp_path: Path, extra_args: list[str]) -> Iterator[BrokerProcess]:
    """A real broker subprocess on fresh storage, started; stopped cleanly (exit 0) if the test left it running."""
    b = make_broker(tmp_path)
    b.extra_args = list(extra_args)
    try:
        b.start()
        yield b
        if b.proc is not None and b.proc.poll() is None:
            assert b.stop() == 0
    finally:
        b.ensure_dead()


def in_arena_mapping(address: int) -> bool:
    """Whether ``address`` lies in this process's mapping of a persisting arena file (zero-copy: no copy made)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/dev/shm/persisting-"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return True
    return False
