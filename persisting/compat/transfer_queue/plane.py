"""Starting, finding and attaching to the data plane: one ``persisting-broker`` per node.

``init(conf)`` in the first process starts a broker (a subprocess in its own session, so that it outlives a
kill -9 of the process that started it: what it acknowledged is on disk and the next ``init`` attaches to it),
unless ``PERSISTING_BROKER`` names one. Where it listens is written to ``transfer_queue[-<ray cluster>].json`` in
the runtime folder (``$XDG_RUNTIME_DIR/persisting``, else ``<tmp>/persisting-<uid>``), so ``init()`` in any other
process of the node (Ray workers included, whatever their working directory) attaches to the same broker, and two
runs with their own Ray clusters get a data plane each. Only the process
that started the broker stops it in ``close()``; ``close()`` elsewhere only lets go of it.

Configuration (``conf`` is TransferQueue's config; persisting reads only its optional ``persisting`` section)::

    persisting.storage_path   where the data lives (default $PERSISTING_STORAGE_PATH, else
                              $XDG_STATE_HOME/persisting/transfer_queue): a restarted run finds its keys there
    persisting.socket         the broker's ZeroMQ address (default ipc://<runtime folder>/tq-broker.sock)
    persisting.arena_bytes    the broker's shared-memory arena (default 1 GiB)
    persisting.topic          the topic name (default "transfer_queue")
    persisting.fresh          true: clear every partition at init (a new run on old storage)
    persisting.metrics        the broker's Prometheus endpoint, "HOST:PORT" (default off)
    persisting.objects        "pickle" (default: NonTensorStack entries pickled in the clients) or "codec"
    persisting.durability     "process" (default: survives kill -9 of any process) or "sync" (power loss too)
    persisting.backend        "auto" (default), "ray" or "broker": on several nodes, ``ray_plane.py``
    persisting.dedup          "auto" (default, or $PERSISTING_TQ_DEDUP), true, false or field names: ``dedup_mode``
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

from persisting import Queue
from persisting.tensors import dedup

from .. import _engine
from .store import KVStore

DEFAULT_ARENA_BYTES = 1 << 30
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


def _section(conf: Any) -> dict[str, Any]:
    if conf is None:
        return {}
    try:
        section = conf.get("persisting", None) if hasattr(conf, "get") else None
    except Exception:  # an OmegaConf struct config without the key
        section = None
    if section is None:
        return {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(section):
            return dict(OmegaConf.to_container(section, resolve=True))  # type: ignore[arg-type]
    except ImportError:
        pass
    return dict(section)


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


def storage_path(section: dict[str, Any]) -> str:
    storage = section.get("storage_path") or os.environ.get("PERSISTING_STORAGE_PATH")
    if not storage:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        storage = str(Path(state) / "persisting" / "transfer_queue")
    return str(storage)


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


def dedup_mode(section: dict[str, Any]) -> Any:
    """``persisting.dedup``: which fields a put stores once per distinct value (docs/guides/verl.md).

    "auto" (the default): each field decided at its first put into the topic, kept after (``tensors/dedup.py``):
    NonTensorStack columns whose pickles are >= 4 KiB per sample (``multi_modal_inputs``: a GRPO group's n
    responses carry the prompt's one ``pixel_values``), tensor columns whose samples are >= 4 KiB and repeat in
    that put (a prompt's image or tokens repeated per response). A text-only run's token, mask and log prob
    columns are distinct per response and stay plain (hashed once, at their first put), as do its small
    non-tensor columns. true: every NonTensorStack column and dense column >= 4 KiB per sample; false:
    none; a list: those fields (whatever their size)."""
    value = section.get("dedup")
    if value is None:  # $PERSISTING_TQ_DEDUP: true, false, auto or field names separated by commas
        env = os.environ.get("PERSISTING_TQ_DEDUP", dedup.AUTO)
        value = env.lower() if env.lower() in ("true", "false", dedup.AUTO) else [f for f in env.split(",") if f]
    if isinstance(value, str) and value.lower() in ("true", "false", dedup.AUTO):  # from an environment or a CLI
        value = dedup.AUTO if value.lower() == dedup.AUTO else value.lower() == "true"
    return dedup.check_mode(value)


def open_store(address: str, section: dict[str, Any]) -> KVStore:
    """The layer's store over the broker at ``address``: the data topic (its keys are the engine's index)."""
    topic = str(section.get("topic") or "transfer_queue")
    # "process" durability: a put is acknowledged once written to the broker's log (survives kill -9 of any
    # process, not a power loss); TransferQueue keeps everything in RAM, so this is already far more.
    durability = str(section.get("durability") or "process")
    # Python objects (NonTensorStack entries) are pickled and unpickled in the clients, never in the broker
    # (TransferQueue pickles everything); "codec" stores only what the record codec types exactly.
    objects = None if section.get("objects") == "codec" else "pickle"
    mode = dedup_mode(section)
    data = Queue(topic, broker=address, durability=durability, num_buckets=1, objects=objects, dedup=mode)
    return KVStore(data, mode)


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


def connect(conf: Any) -> Any:
    """Attach to the node's broker (``PERSISTING_BROKER``, else the one ``transfer_queue.json`` names), or start
    one with ``conf`` if none runs; on several nodes, the plane of ``ray_plane.py`` (``backend``)."""
    section = _section(conf)
    env = os.environ.get("PERSISTING_BROKER")
    if env:
        return Plane(env, None, section)
    from . import ray_plane  # Ray only where it is used

    if ray_plane.wanted(section):
        return ray_plane.connect(section)
    with _locked():
        found = _read_discovery()
        if found is not None:
            return Plane(found["address"], None, {**section, **found.get("section", {})})
        address, proc = _start_broker(section)
        tmp = discovery_file().with_suffix(".tmp")
        tmp.write_text(json.dumps({"address": address, "pid": proc.pid, "section": _public(section)}))
        tmp.replace(discovery_file())
        return Plane(address, proc, section)


def _public(section: dict[str, Any]) -> dict[str, Any]:
    """What attaching processes need to open the same topics."""
    return {k: section[k] for k in ("topic", "durability", "objects", "metrics", "dedup") if k in section}
