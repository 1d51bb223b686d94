"""The broker's settings: defaults, the TOML file, ``PERSISTING_*`` environment variables and flags, in that order
of precedence (the table is in ``broker/__main__.py``'s docstring), checked once at start."""

from __future__ import annotations

import argparse
import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from persisting.tensors.arena import DEFAULT_ARENA_BYTES
from persisting.wire import protocol

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SETTINGS = (
    "storage_path",
    "socket",
    "max_message_bytes",
    "log_level",
    "socket_mode",
    "arena_bytes",
    "shm_budget",
    "shm_dir",
    "metrics",
    "local_path",
)
# Only in the TOML file (a [storage_options] table) or PERSISTING_STORAGE_OPTIONS (JSON): never a flag, so that
# credentials do not show in the process list. [backend_options]: the Lance backend's keyword arguments for every
# topic (compact_min_fragments, target_rows_per_fragment, ...: docs/concepts/records.md), a table too.
FILE_ONLY_SETTINGS = ("storage_options", "backend_options")


def default_socket() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / "persisting" if runtime else Path(tempfile.gettempdir()) / f"persisting-{os.getuid()}"
    return f"ipc://{folder / 'broker.sock'}"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "storage_path": "./data",
        "socket": default_socket(),
        "max_message_bytes": protocol.DEFAULT_MAX_MESSAGE_BYTES,
        "log_level": "INFO",
        "socket_mode": "0600",
        "arena_bytes": DEFAULT_ARENA_BYTES,
        "metrics": "",
    }
    config_file = args.config or os.environ.get("PERSISTING_CONFIG")
    if config_file:
        with open(config_file, "rb") as f:
            data = tomllib.load(f)
        unknown = set(data) - set(SETTINGS) - set(FILE_ONLY_SETTINGS)
        if unknown:
            raise SystemExit(f"persisting-broker: unknown settings in {config_file}: {sorted(unknown)}")
        out.update(data)
        if not isinstance(out.get("backend_options", {}), dict):
            raise SystemExit(f"persisting-broker: backend_options in {config_file} must be a table ([backend_options])")
    for key in SETTINGS:
        env = os.environ.get(f"PERSISTING_{key.upper()}")
        if env:
            out[key] = env
        flag = getattr(args, key, None)
        if flag is not None:
            out[key] = flag
    out["max_message_bytes"] = int(out["max_message_bytes"])
    out["arena_bytes"] = parse_bytes("arena_bytes", out["arena_bytes"])
    if out["arena_bytes"] < 0:
        raise SystemExit("persisting-broker: arena_bytes must be >= 0 (0 runs without an arena)")
    if out.get("shm_budget") not in (None, ""):
        out["shm_budget"] = parse_bytes("shm_budget", out["shm_budget"])
        if out["shm_budget"] < out["arena_bytes"]:
            raise SystemExit(
                f"persisting-broker: shm_budget ({out['shm_budget']} bytes) must be at least arena_bytes "
                f"({out['arena_bytes']}): the budget counts the first segment too"
            )
    else:
        out["shm_budget"] = None  # derived from the machine at start (broker/segments.py default_budget)
    if str(out["log_level"]).upper() not in LOG_LEVELS:
        raise SystemExit(
            f"persisting-broker: log_level must be one of {', '.join(LOG_LEVELS)}, got {out['log_level']!r}"
        )
    try:
        out["socket_mode"] = int(str(out["socket_mode"]), 8)
    except ValueError:
        raise SystemExit(
            f"persisting-broker: socket_mode must be octal like 0660, got {out['socket_mode']!r}"
        ) from None
    if out["socket_mode"] & ~0o666:
        raise SystemExit("persisting-broker: socket_mode may only hold read/write bits (e.g. 0600 or 0660)")
    return out


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(name: str, value: Any) -> int:
    """A byte count from a setting: an int, or a number with K, M, G or T (powers of 1024; "8G", "1.5GiB")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    try:
        return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise SystemExit(
            f"persisting-broker: {name} must be a byte count such as 268435456, 512M or 8G, got {value!r}"
        ) from None
