"""Who is connected: ZeroMQ connection events (a socket monitor) and the client processes that said hello.

The ROUTER socket's monitor reports each accepted and each closed connection; their difference is the number of
connected clients. ZeroMQ tells no identity with these events (ROUTER_NOTIFY, which would, is a draft option
that the released libzmq builds leave out), so client processes are listed from their ``hello``: each sends its
``peer`` ([pid, start time], as the arena names processes), and the list drops a process once /proc says
it exited. Nothing here runs per request: only on connection events and hellos.

A message over ``--max-message-bytes`` never reaches the broker: ZeroMQ drops it and closes that connection (the
client reconnects). It shows as a dropped connection (``disconnects``), the only trace ZeroMQ leaves of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from persisting.tensors.arena import Peer, peer_alive

log = logging.getLogger("persisting.broker")

MAX_KNOWN_CLIENTS = 4096  # processes listed by status; beyond that the oldest entries go


@dataclass(slots=True)
class ClientProcess:
    pid: int
    started: int  # process start time, clock ticks since boot (tells a reused pid apart)
    identity: str  # the ZeroMQ routing id of its connection, hex
    first_hello: float  # time.time()
    last_hello: float


class Connections:
    def __init__(self) -> None:
        self.connected = 0
        self.accepted = 0
        self.disconnects = 0
        self._clients: dict[Peer, ClientProcess] = {}
        self._monitor: zmq.Socket[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, sock: zmq.Socket[bytes], loop: asyncio.AbstractEventLoop) -> None:
        """Start counting connections of ``sock`` (call before it binds, so none is missed)."""
        events = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
        self._monitor = sock.get_monitor_socket(events)
        self._loop = loop
        loop.add_reader(self._monitor.fileno(), self._drain)
        # ZeroMQ's FD only signals once the socket has processed its pending commands: a first read arms it.
        loop.call_soon(self._drain)

    def _drain(self) -> None:
        # Like the ROUTER, the monitor's FD is edge-triggered: read until nothing is left.
        monitor = self._monitor
        while monitor is not None:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                log.warning("reading connection events failed: %s", exc)
                return
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.accepted += 1
                self.connected += 1
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.disconnects += 1
                self.connected = max(0, self.connected - 1)

    def hello(self, identity: bytes, raw: Any, kernel_peer: Peer | None = None) -> None:
        """A hello from ``identity``: its process listed under ``kernel_peer`` (the kernel's word, peers.py)
        where there is one, else under the ``peer`` it says it is (``raw``: [pid, start time])."""
        if kernel_peer is not None:
            peer = kernel_peer
        else:
            if not (isinstance(raw, list) and len(raw) == 2 and all(type(x) is int for x in raw)):
                return  # an older client: counted as a connection, not listed
            peer = (raw[0], raw[1])
        now = time.time()
        known = self._clients.get(peer)
        if known is None:
            if len(self._clients) >= MAX_KNOWN_CLIENTS:
                self._clients.pop(next(iter(self._clients)))
            self._clients[peer] = ClientProcess(peer[0], peer[1], identity.hex(), now, now)
        else:
            known.identity, known.last_hello = identity.hex(), now

    def clients(self) -> list[dict[str, Any]]:
        """The client processes that said hello and still run (the status command's ``clients``)."""
        for peer in [p for p in self._clients if not peer_alive(p)]:
            del self._clients[peer]
        return [
            {"pid": c.pid, "identity": c.identity, "first_hello": c.first_hello, "last_hello": c.last_hello}
            for c in self._clients.values()
        ]

    def close(self) -> None:
        if self._monitor is not None:
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self._monitor.fileno())
            self._monitor.close(linger=0)
            self._monitor = None
