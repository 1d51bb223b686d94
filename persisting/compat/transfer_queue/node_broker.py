"""The data plane on one node: its ``persisting-broker``, started, found and attached to.

``init(conf)`` in the first process starts a broker (a subprocess in its own session, so that it outlives a
kill -9 of the process that started it: what it acknowledged is on disk and the next ``init`` attaches to it),
unless ``PERSISTING_BROKER`` names one. Where it listens is written to ``transfer_queue[-<ray cluster>].json`` in
the runtime folder (``$XDG_RUNTIME_DIR/persisting``, else ``<tmp>/persisting-<uid>``), so ``init()`` in any other
process of the node (Ray workers included, whatever their working directory) attaches to the same broker, and two
runs with their own Ray clusters get a data plane each. Only the process
that started the broker stops it in ``close()``; ``close()`` elsewhere only lets go of it.

What ``conf`` may set: ``config.py``. Which plane ``init`` joins (this one, or the plane on several nodes of
``ray_plane.py``): ``interface.connect``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import _engine
from .config import DEFAULT_ARENA_BYTES, open_store, storage_path

BROKER_START_TIMEOUT_S = 60.0
BROKER_STOP_TIMEOUT_S = 60.0


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "persisting" if base else Path(tempfile.gettempdir()) / f"persisting-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def scope() -> str:
    """What tells this run's data plane apart from another's on the node: the Ray cluster when Ray is up (verl
    calls ``init`` in Ray actors; each run has its own cluster, as TransferQueue has its own controller), else
    nothing (one data plane per user and node)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    address = str(ray.get_runtime_context().gcs_address)
    return "-" + hashlib.sha256(address.encode()).hexdigest()[:12]


def discovery_file() -> Path:
    return runtime_dir() / f"transfer_queue{scope()}.json"


def _alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"broker" in cmdline


def _read_discovery() -> dict[str, Any] | None:
    try:
        found = json.loads(discovery_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("address"), str):
        return None
    pid = found.get("pid")
    if isinstance(pid, int) and not _alive(pid):
        return None
    return found


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One process at a time finds or starts the broker (two first inits must not start two)."""
    with open(runtime_dir() / f"transfer_queue{scope()}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _start_broker(section: dict[str, Any]) -> tuple[str, subprocess.Popen[bytes]]:
    storage = storage_path(section)
    address = section.get("socket") or f"ipc://{runtime_dir() / f'tq-broker{scope()}.sock'}"
    arena = int(section.get("arena_bytes") or DEFAULT_ARENA_BYTES)
    log_path = runtime_dir() / f"tq-broker{scope()}.log"
    cmd = [sys.executable, "-m", "broker", "--storage-path", str(storage), "--socket", address]
    cmd += ["--arena-bytes", str(arena)]
    if section.get("metrics"):  # Prometheus, "HOST:PORT" or a port: get_metrics_endpoint() gives it back
        cmd += ["--metrics", str(section["metrics"])]
    with open(log_path, "ab") as log:
        start = log.tell()
        # Its own session: a signal to the starting process's group (Ctrl-C, a kill of the job) does not stop it.
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + BROKER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(log_path, "rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace")
        if "ready on" in text:
            return address, proc
        if proc.poll() is not None:
            raise RuntimeError(f"persisting-broker exited with {proc.returncode} at start: {text[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"persisting-broker did not get ready in {BROKER_START_TIMEOUT_S} s (log: {log_path})")


class Plane:
    """This process's handle on the data plane: the store, and the broker if this process started it."""

    def __init__(self, address: str, proc: subprocess.Popen[bytes] | None, section: dict[str, Any]) -> None:
        self.address = address
        self.proc = proc
        self.section = section
        metrics = section.get("metrics")
        self.metrics_endpoint: str | None = None
        if metrics:
            self.metrics_endpoint = f"127.0.0.1:{metrics}" if str(metrics).isdigit() else str(metrics)
        self.store = open_store(address, section)

    @property
    def owner(self) -> bool:
        return self.proc is not None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            _engine.run(self.store.aclose())
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(BROKER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            with contextlib.suppress(OSError):
                found = json.loads(discovery_file().read_text())
                if found.get("pid") == self.proc.pid:
                    discovery_file().unlink()


def _public(section: dict[str, Any]) -> dict[str, Any]:
    """What attaching processes need to open the same topics."""
    return {k: section[k] for k in ("topic", "durability", "objects", "metrics", "dedup") if k in section}


def attach(section: dict[str, Any]) -> Plane:
    """Attach to the node's broker (``PERSISTING_BROKER``, else the one ``transfer_queue.json`` names), or start
    one with ``section`` if none runs."""
    env = os.environ.get("PERSISTING_BROKER")
    if env:
        return Plane(env, None, section)
    with _locked():
        found = _read_discovery()
        if found is not None:
            return Plane(found["address"], None, {**section, **found.get("section", {})})
        address, proc = _start_broker(section)
        tmp = discovery_file().with_suffix(".tmp")
        tmp.write_text(json.dumps({"address": address, "pid": proc.pid, "section": _public(section)}))
        tmp.replace(discovery_file())
        return Plane(address, proc, section)
