"""Who sent a request, in the kernel's words: the process that holds arena space is never the client's say-so.

On an ipc socket (a Unix domain socket) the kernel records the connecting process's credentials (SO_PEERCRED),
and libzmq hands them out with every message as its ``Peer-Address`` property: ``<host>:<uid>:<gid>:<pid>``
(``zmq_msg_gets``; pyzmq ``Frame.get``). The broker names the process by that pid and the start time /proc gives
for it (a pid alone may be reused once the process exits; the pair is not): the ``Peer`` every lease, hold and
reap is about. A request's own ``peer`` argument is ignored for arena space.

Connections without credentials (``tcp://``, or a client in a pid namespace the broker cannot see: the kernel
then says pid 0) are served without the arena: their hello shows none, so the client copies tensors over the
socket, and the broker refuses their leases and answers their get_data with copies, never with holds. Such a
client cannot pin arena space nor release anyone else's.

Looked up once per connection (ZeroMQ routing id), on its first message; the cache is bounded.
"""

from __future__ import annotations

import contextlib
from typing import Any

import zmq

from persisting.errors import ConfigError, ProtocolError
from persisting.tensors.arena import Peer

MAX_CACHED_CONNECTIONS = 4096


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # the command name (field 2) may hold spaces and parentheses
    return int(fields[19]) if len(fields) > 19 else None


class Peers:
    def __init__(self, address: str) -> None:
        self._credentials = address.startswith("ipc://")
        self._by_connection: dict[bytes, Peer | None] = {}

    def of(self, identity: bytes, frame: Any) -> Peer | None:
        """The process behind the connection ``identity`` (``frame``: a ``zmq.Frame`` of its message), or None
        where the transport does not say."""
        if identity in self._by_connection:
            return self._by_connection[identity]
        peer = self._from_kernel(frame) if self._credentials else None
        if len(self._by_connection) >= MAX_CACHED_CONNECTIONS:
            self._by_connection.pop(next(iter(self._by_connection)))
        self._by_connection[identity] = peer
        return peer

    @staticmethod
    def _from_kernel(frame: Any) -> Peer | None:
        address = ""
        with contextlib.suppress(zmq.ZMQError, AttributeError, UnicodeDecodeError):
            address = frame.get("Peer-Address")
        parts = str(address).rsplit(":", 3)
        if len(parts) != 4 or not parts[3].isdigit():
            return None
        pid = int(parts[3])
        started = start_time(pid) if pid > 0 else None
        return None if started is None else (pid, started)


def arena_peer(op: str, peer: Peer | None) -> Peer:
    """The process that arena space of a request belongs to: the kernel's word (``peers.py``), never the
    request's."""
    if peer is None:
        raise ConfigError(
            f"{op}: the arena is only for clients on this node's ipc socket, named by the kernel; this connection "
            "carries no peer credentials (tcp, or another pid namespace): tensors go over the socket instead"
        )
    return peer


def claimed(op: str, raw: Any) -> Peer:
    """The process a request says it is (``raw``: its ``peer`` argument): only where nothing is at stake for others
    (a take's consumption lease, which expires by itself)."""
    if not (isinstance(raw, list) and len(raw) == 2 and all(type(x) is int for x in raw)):
        raise ProtocolError(f"{op} needs peer = [pid, start time]")
    return (raw[0], raw[1])
