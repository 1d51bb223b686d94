"""One ``persisting-broker`` subprocess, started and kept running by the node's actor.

The supervisor thread forks the broker with ``PR_SET_PDEATHSIG`` set to SIGKILL, so a broker never outlives the
actor that owns it (Ray kills an actor's worker with SIGKILL when its raylet goes; an orphaned broker would keep
the topic's lock and the arena). A broker that exits on its own (a crash, a kill -9) is started again on the
same storage path, socket and arena file: its write-ahead log, consumption log and arena hold everything that
was acknowledged, and clients re-send what was in flight. With an object-store storage path the broker also gets
its local folder (``--local-path``) and the store's options in its environment (never on its command line).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ..errors import BrokerUnavailableError

log = logging.getLogger("persisting.ray")

READY_TIMEOUT_S = 60.0  # a fresh broker opens no topic at start: it is ready in well under a second
RESTART_PAUSE_S = 0.2  # between a broker's exit and its restart, so a broker that cannot start does not spin
STOP_TIMEOUT_S = 30.0  # SIGTERM flushes every topic before the broker exits
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: only async-signal-safe work (one syscall).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class BrokerProcess:
    """A supervised broker on ``storage_path`` listening on ``address`` (an ``ipc://`` socket)."""

    def __init__(
        self,
        storage_path: str,
        address: str,
        arena_bytes: int,
        log_path: Path,
        local_path: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.storage_path = storage_path
        self.local_path = local_path
        self._env = dict(env or {})  # may hold credentials: never shown
        self.address = address
        self.arena_bytes = arena_bytes
        self.log_path = log_path
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._ready = threading.Event()
        self._failure: str | None = None
        self._thread = threading.Thread(target=self._supervise, name=f"broker {address}", daemon=True)

    def start(self) -> None:
        """Start the broker and return once it listens (or raise ``BrokerUnavailableError``)."""
        self._thread.start()
        if not self._ready.wait(READY_TIMEOUT_S) or self._failure is not None:
            raise BrokerUnavailableError(
                f"persisting-broker on {self.storage_path} did not start: {self._failure or 'no ready line'}; "
                f"its log is {self.log_path}"
            )

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def wait_running(self, timeout_s: float) -> int:
        """The pid of a running, ready broker (after a restart, once it is ready again)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.pid
            if pid is not None and self._ready.is_set():
                return pid
            time.sleep(0.05)
        raise BrokerUnavailableError(f"persisting-broker on {self.storage_path} is not running after {timeout_s} s")

    def stop(self) -> int | None:
        """SIGTERM (the broker flushes and exits 0); the supervisor then stops restarting it."""
        self._stopping = True
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._thread.join(STOP_TIMEOUT_S)
        return proc.returncode

    def _command(self) -> list[str]:
        local = ["--local-path", self.local_path] if self.local_path is not None else []
        return [
            sys.executable,
            "-m",
            "broker",
            "--storage-path",
            self.storage_path,
            *local,
            "--socket",
            self.address,
            "--arena-bytes",
            str(self.arena_bytes),
        ]

    def _supervise(self) -> None:
        # PDEATHSIG fires when the forking *thread* ends: this thread forks every broker and lives as long as
        # the actor's process, so the broker dies with the actor and not before.
        while not self._stopping:
            self._ready.clear()
            with open(self.log_path, "ab") as err:
                proc = subprocess.Popen(
                    self._command(),
                    stdout=subprocess.PIPE,
                    stderr=err,
                    preexec_fn=_die_with_parent,
                    bufsize=0,
                    env={**os.environ, **self._env},
                )
            self._proc = proc
            line = proc.stdout.readline() if proc.stdout is not None else b""
            if b"ready" in line:
                self._ready.set()
            else:
                self._failure = f"exit status {proc.wait()}"
                self._ready.set()
                return
            if proc.stdout is not None:
                proc.stdout.close()
            status = proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            log.warning("persisting-broker on %s exited with %s; restarting it", self.storage_path, status)
            time.sleep(RESTART_PAUSE_S)


def socket_address(key: str) -> str:
    """A short ipc address for broker ``key`` (ipc paths are limited to ~107 bytes)."""
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"persisting-ray-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return f"ipc://{folder}/{key}.sock"
