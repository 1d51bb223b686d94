"""Who a process is, for the broker's book of shared memory: ``(pid, start time)``, since a pid alone can be reused
by a new process after the old one died, the pair cannot."""

from __future__ import annotations

import os

Peer = tuple[int, int]  # (pid, start time in clock ticks since boot)

_peer: tuple[int, Peer] | None = None


def peer_alive(peer: Peer) -> bool:
    """Whether the process ``peer`` names still runs (a reused pid has another start time)."""
    pid, started = peer
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The command name (field 2) may hold spaces or parentheses: split after its closing parenthesis.
    fields = stat.rsplit(b")", 1)[-1].split()
    return len(fields) > 19 and int(fields[19]) == started


def peer_id() -> list[int]:
    """[pid, start time]: how the broker tells this process from a later one that reuses its pid."""
    global _peer
    pid = os.getpid()
    if _peer is None or _peer[0] != pid:
        with open(f"/proc/{pid}/stat", "rb") as f:
            started = int(f.read().rsplit(b")", 1)[-1].split()[19])
        _peer = (pid, (pid, started))
    return list(_peer[1])
