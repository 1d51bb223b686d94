"""persisting-broker: run the broker in the foreground (``serve``, the default) or ask one for ``status``.

Settings, highest precedence first: command-line flags, ``PERSISTING_*`` environment variables, the TOML file
given by ``--config`` (or ``PERSISTING_CONFIG``), defaults::

    setting             flag                 environment                   default
    storage_path        --storage-path       PERSISTING_STORAGE_PATH       ./data
    socket              --socket             PERSISTING_SOCKET             ipc://$XDG_RUNTIME_DIR/persisting/broker.sock
                                                                           (or <tmp>/persisting-<uid>/broker.sock)
    max_message_bytes   --max-message-bytes  PERSISTING_MAX_MESSAGE_BYTES  268435456
    log_level           --log-level          PERSISTING_LOG_LEVEL          INFO
    socket_mode         --socket-mode        PERSISTING_SOCKET_MODE        0600 (0660: the group may connect)
    arena_bytes         --arena-bytes        PERSISTING_ARENA_BYTES        268435456 (the first shared-memory
                                                                           segment, reserved at start; 0: no
                                                                           shared memory)
    shm_budget          --shm-budget         PERSISTING_SHM_BUDGET         min(30% of RAM, half of /dev/shm's free
                                                                           space), at least arena_bytes: the most
                                                                           shared memory the segments may take
                                                                           (bytes, or 512M, 8G, 1T)
    shm_dir             --shm-dir            PERSISTING_SHM_DIR            /dev/shm (a tmpfs mounted with huge=
                                                                           within_size gives huge pages: see
                                                                           docs/concepts/batch-sizes.md)
    metrics             --metrics            PERSISTING_METRICS            off (Prometheus metrics at PORT,
                                                                           HOST:PORT or unix:PATH; a bare port
                                                                           binds 127.0.0.1)

    local_path          --local-path         PERSISTING_LOCAL_PATH         with an object-store storage_path
                                                                           (s3://, gs://, az://): the local folder
                                                                           of the log and locks
    storage_options     (TOML table only)    PERSISTING_STORAGE_OPTIONS    Lance's object-store options (JSON)
    backend_options     (TOML table only)                                  the Lance backend's options for every
                                                                           topic (compact_min_fragments = 16, ...)

``check [--repair] [--topic NAME]`` verifies the store at --storage-path while no broker serves it (broker/check.py).

``status`` prints a running broker's topics, partitions, tasks (backlog, leases), flush lag, arena and clients;
``status --json`` prints the same as one JSON object (its keys: broker/status.py). It exits 1 when no broker
answers. ``--help`` says all of this in a user's words (``make_parser``).

The shared-memory files (/dev/shm/persisting-<hash of storage path>.arena and .arena.<n>) get socket_mode too: a
client that may connect may map them.

The broker serves on uvloop (a dependency of persisting where it builds; ``PERSISTING_BROKER_LOOP=asyncio``
picks asyncio's own loop; ``hello`` answers which one runs).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from persisting.engine import parse_location
from persisting.errors import PersistingError
from persisting.tensors.arena import DEFAULT_ARENA_BYTES
from persisting.wire import protocol

from . import check
from .server import Broker
from .settings import LOG_LEVELS, settings
from .status import render as render_status

log = logging.getLogger("persisting.broker")

STATUS_TIMEOUT_S = 5.0
GIL_SWITCH_INTERVAL_S = 0.0005  # the broker's sys.setswitchinterval (see run_loop)


def notify_systemd(message: str) -> None:
    """sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET (no-op outside systemd). A broken
    notify socket is logged, never fatal: the broker serves whether or not systemd hears it."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("could not notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)


def lock_storage(storage_path: Path) -> int:
    storage_path.mkdir(parents=True, exist_ok=True)
    fd = os.open(storage_path / "broker.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SystemExit(
            f"persisting-broker: another broker (pid {holder}) already serves {storage_path}; "
            "stop it first or use another --storage-path"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


async def serve(conf: dict[str, Any]) -> None:
    try:
        location = parse_location(conf["storage_path"], conf.get("storage_options"), conf.get("local_path"))
    except PersistingError as exc:
        raise SystemExit(f"persisting-broker: {exc}") from exc
    storage_path = location.local  # the log, locks and arena key stay local; flushed data may be remote
    address = conf["socket"]
    if address.startswith("ipc://"):
        folder = Path(address[len("ipc://") :]).parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock_fd = lock_storage(storage_path)
    try:
        broker = Broker(
            storage_path,
            address,
            max_message_bytes=conf["max_message_bytes"],
            socket_mode=conf["socket_mode"],
            arena_bytes=conf["arena_bytes"],
            shm_budget=conf["shm_budget"],
            shm_dir=Path(conf["shm_dir"]) if conf.get("shm_dir") else None,
            metrics=bool(conf["metrics"]),
            location=location,
            backend_options=conf.get("backend_options"),
        )
    except PersistingError as exc:
        os.close(lock_fd)
        raise SystemExit(f"persisting-broker: {exc}") from exc
    exposition = None
    try:
        await broker.start()  # re-adopts an arena a killed broker left, then reserves a fresh one
        if broker.metrics is not None:
            from .metrics import MetricsServer

            exposition = MetricsServer(broker.metrics, str(conf["metrics"]), conf["socket_mode"])
            await exposition.start()
            log.info("Prometheus metrics on %s", exposition.bound)
        broker.bind()
    except PersistingError as exc:
        # A start that fails after the arena was made (a socket it cannot listen on, a metrics port in use) gives
        # it back: its /dev/shm file must not outlive this process.
        if exposition is not None:
            await exposition.close()
        await broker.close()
        os.close(lock_fd)
        raise SystemExit(f"persisting-broker: {exc}") from exc
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        notify_systemd("STOPPING=1")
        broker.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    print(f"persisting-broker ready on {address} (storage {location.describe()}, pid {os.getpid()})", flush=True)
    notify_systemd("READY=1\nSTATUS=serving")
    try:
        await broker.serve()
    finally:
        if exposition is not None:
            await exposition.close()
        os.close(lock_fd)
    log.info("stopped cleanly")


async def status(conf: dict[str, Any], as_json: bool) -> int:
    from persisting.client.connection import Connection

    address = str(conf["socket"])
    if address.startswith("ipc://") and not Path(address[len("ipc://") :]).exists():
        # Nothing listens there: say so now instead of waiting for the request to time out.
        print(
            f"persisting-broker status: no broker listens at {address} (its socket file does not exist)",
            file=sys.stderr,
        )
        return 1
    conn = Connection(address)
    try:
        state = (await conn.request("status", {}, timeout=STATUS_TIMEOUT_S)).result
    except PersistingError as exc:
        print(f"persisting-broker status: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    print(json.dumps(state, indent=2, sort_keys=True) if as_json else render_status(state))
    return 0


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Serve on uvloop where it is installed (a dependency of persisting on Linux and macOS): its loop costs less
    per request than asyncio's (~10 % of a put's round trip measured in bench broker). PERSISTING_BROKER_LOOP=asyncio
    picks asyncio's own loop."""
    choice = os.environ.get("PERSISTING_BROKER_LOOP", "uvloop")
    # The loop thread shares the GIL with the write-ahead log's sync thread and the flush's Lance threads: a sync
    # thread whose fdatasync returned waits for the GIL up to this long before it can wake the loop (default 5 ms,
    # longer than the fdatasync itself), and a durable put waits with it.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    if choice not in ("uvloop", "asyncio"):
        raise SystemExit(f"PERSISTING_BROKER_LOOP must be uvloop or asyncio, got {choice!r}")
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.info("uvloop is not installed: serving on asyncio's event loop")
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


_MIB = 1024 * 1024


def make_parser() -> argparse.ArgumentParser:
    """The command line; every option's help is for the person running the broker (tests/test_broker_help.py)."""
    parser = argparse.ArgumentParser(
        prog="persisting-broker",
        description=(
            "Run the persisting broker in the foreground (serve, the default), or ask a running one for its state "
            "(status), or verify a stopped broker's store (check). One broker per node owns the storage and the "
            "shared-memory arena; processes reach it "
            "with Queue(..., broker=ADDRESS) or PERSISTING_BROKER=ADDRESS."
        ),
        epilog=(
            "Each setting can also come from the environment (PERSISTING_STORAGE_PATH, PERSISTING_SOCKET, "
            "PERSISTING_MAX_MESSAGE_BYTES, PERSISTING_LOG_LEVEL, PERSISTING_SOCKET_MODE, PERSISTING_LOCAL_PATH, "
            "PERSISTING_ARENA_BYTES, PERSISTING_SHM_BUDGET, PERSISTING_SHM_DIR, PERSISTING_METRICS) or from the "
            "--config file; a flag beats the environment, which beats the file. SIGTERM or SIGINT stops the broker "
            "cleanly: it flushes every topic and exits 0."
        ),
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=["serve", "status", "stats", "check"],
        help="serve (the default): run the broker until it is stopped; status (stats is the same): print a "
        "running broker's topics, partitions, tasks, arena and clients, and exit 1 if no broker answers; "
        "check: verify the store at --storage-path while no broker runs (every topic's log, buckets, row order, "
        "consumption log, spool and leftover files), print what it found per topic, exit 0 when all is well "
        "and 1 otherwise",
    )
    parser.add_argument(
        "--storage-path",
        dest="storage_path",
        metavar="PATH",
        help="folder that holds the topics' data, the write-ahead log and the lock (default ./data); an "
        "s3://, gs:// or az:// URI keeps the data in that bucket and the log in a local folder (--local-path)",
    )
    parser.add_argument(
        "--socket",
        dest="socket",
        metavar="ADDRESS",
        help="ZeroMQ address to serve on, or of the broker to ask for status, e.g. "
        "ipc:///run/persisting/broker.sock (default ipc://$XDG_RUNTIME_DIR/persisting/broker.sock, or "
        "<tmp>/persisting-<uid>/broker.sock without XDG_RUNTIME_DIR)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help='TOML file of these settings by name (storage_path = "/var/lib/persisting", arena_bytes = ..., and '
        "a [storage_options] table for the bucket's credentials); default: $PERSISTING_CONFIG, else none",
    )
    parser.add_argument(
        "--max-message-bytes",
        dest="max_message_bytes",
        type=int,
        metavar="BYTES",
        help="largest request the broker accepts; a bigger one is dropped and its connection closed "
        f"(default {protocol.DEFAULT_MAX_MESSAGE_BYTES}, {protocol.DEFAULT_MAX_MESSAGE_BYTES // _MIB} MiB)",
    )
    parser.add_argument(
        "--log-level",
        dest="log_level",
        metavar="LEVEL",
        help=f"how much the broker writes to stderr: {', '.join(LOG_LEVELS)} (default INFO)",
    )
    parser.add_argument(
        "--socket-mode",
        dest="socket_mode",
        metavar="MODE",
        help="octal permissions of the ipc socket file and the arena file: 0600 (default) lets only the "
        "broker's user connect, 0660 its group too",
    )
    parser.add_argument(
        "--local-path",
        dest="local_path",
        metavar="PATH",
        help="with an object-store --storage-path: the local folder for the write-ahead log and the locks "
        "(default: one folder per URI under $XDG_STATE_HOME/persisting, or ~/.local/state/persisting)",
    )
    parser.add_argument(
        "--arena-bytes",
        dest="arena_bytes",
        metavar="BYTES",
        help="size of the first shared-memory segment, reserved at start: small batches stream through it "
        f"(default {DEFAULT_ARENA_BYTES}, {DEFAULT_ARENA_BYTES // _MIB} MiB; 512M or 1G also work; 0: no "
        "shared memory, tensor batches then travel as copies)",
    )
    parser.add_argument(
        "--shm-budget",
        dest="shm_budget",
        metavar="BYTES",
        help="the most shared memory the broker may use, the first segment included: more segments are made "
        "when batches need them and given back when idle, and a batch of any size up to it goes through shared "
        "memory (e.g. 8G; default: the smaller of 30 percent of RAM and half of /dev/shm's free space)",
    )
    parser.add_argument(
        "--shm-dir",
        dest="shm_dir",
        metavar="PATH",
        help="tmpfs folder for the shared-memory files (default /dev/shm); a tmpfs mounted with "
        "huge=within_size gives 2 MiB pages, which make mapping and reading big batches several times cheaper",
    )
    parser.add_argument(
        "--metrics",
        dest="metrics",
        metavar="WHERE",
        help="serve Prometheus metrics at PORT (on 127.0.0.1), HOST:PORT or unix:PATH (default: off)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with status: print the state as one JSON object, for scripts (broker, topics with their "
        "partitions and tasks, arena, connections, clients, bad_frames)",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="with check: also fix what can be fixed without losing an acknowledged row (row order, damaged "
        "frames whose rows are stored, cut records, leftover files) and say what could not be",
    )
    parser.add_argument(
        "--topic",
        metavar="NAME",
        help="with check: only this topic (default: every topic under the storage path)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = make_parser().parse_args(argv)
    conf = settings(args)
    logging.basicConfig(
        level=str(conf["log_level"]).upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    if args.command == "serve":
        run_loop(serve(conf))
    elif args.command == "check":
        raise SystemExit(check.run(conf, args.topic, args.repair))
    else:
        raise SystemExit(asyncio.run(status(conf, args.json)))


if __name__ == "__main__":
    main()
