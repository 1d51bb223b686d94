"""A blocking caller's own socket to a broker: a sync call's round trip without a thread hand-off.

A ``SyncQueue`` (or persist-queue layer) call in broker mode runs its coroutine in the calling thread while the
engine loop is idle (``_loop.run``). Its request would go through the loop's DEALER (``connection.py``), and the
reply would wake the loop's thread, which would wake the caller: two thread hand-offs per round trip, as much as
the round trip itself on a busy machine. Instead the step sends on a DEALER of its own thread and blocks in
``recv`` for the reply, with the loop's baton lent back meanwhile (``_loop.baton_lent``): the loop, its timers and
other callers go on while this thread waits, as they would across an ``await``.

One socket per (thread, broker), made on the thread's first blocking request and closed when the thread ends
(its ``threading.local`` goes, and with it the holder whose finalizer closes the sockets) or in a forked child
(dropped: the parent's sockets are the parent's). The broker names a request by (connection identity, id), and
each socket is its own connection, so ids of different sockets may repeat.

Retries as on the loop's connection: the same request is sent again every ``RESEND_SECONDS`` after its hold, and
at once when the socket reconnects (a restarted broker never saw it); after its timeout the call raises
``BrokerUnavailableError``. The ``recv`` wakes every ``RECV_SLICE_MS`` to look for both. A reply to another id (a
request given up by an interrupt) is dropped.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from .. import errors
from ..wire import zsocket
from ..wire.protocol import Reply
from . import _loop
from .bad_replies import BadReplies

RECV_SLICE_MS = 100  # how often a waiting caller looks for a reconnect or a re-send due


@dataclass(frozen=True, slots=True)
class Retries:
    """The loop's connection's settings (``connection.py`` owns them), so both paths behave alike."""

    resend_s: float
    viewed_frame_bytes: int  # a reply frame at least this big is kept as a view, not copied


class BlockingSocket:
    """One thread's DEALER to one broker, used only by that thread."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVTIMEO, RECV_SLICE_MS)
        self._sock.connect(address)
        self._monitor: zmq.Socket[bytes] = self._sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._lost = False
        self._bad = BadReplies(address)

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)

    def request(self, frames: list[Any], request_id: int, op: str, limit: float, hold: float, how: Retries) -> Reply:
        """Send ``frames`` (request ``request_id``) and block for its reply; ``limit``: seconds before
        ``BrokerUnavailableError``; ``hold``: seconds the broker may keep it before answering (no re-send before)."""
        sock = self._sock
        now = time.monotonic()
        deadline, due = now + limit, now + min(hold + how.resend_s, limit)
        self._send(frames)
        with _loop.baton_lent():
            while True:
                try:
                    got = zsocket.recv_viewing(sock, how.viewed_frame_bytes, blocking=True)
                except zmq.Again:
                    now = time.monotonic()
                    if now >= deadline:
                        raise errors.BrokerUnavailableError(
                            f"no reply from the broker at {self.address} to {op!r} within {limit:.0f} s; "
                            "is persisting-broker running there?"
                        ) from None
                    if self._reconnected() or now >= due:
                        self._send(frames)
                        due = now + min(how.resend_s, deadline - now)
                    continue
                reply = self._bad.decode(got)
                if reply is not None and reply.id == request_id:
                    return reply

    def _send(self, frames: list[Any]) -> None:
        # zmq.Again: the queue to the broker is full (it is down or stalled); the next slice sends again.
        try:  # noqa: SIM105 - contextlib.suppress costs a context manager per request
            zsocket.send(self._sock, frames)
        except zmq.Again:
            pass

    def _reconnected(self) -> bool:
        again = False
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            except (zmq.Again, zmq.ZMQError):
                return again
            if event == zmq.EVENT_DISCONNECTED:
                self._lost = True
            elif event == zmq.EVENT_CONNECTED and self._lost:
                self._lost, again = False, True


class _Sockets:
    """A thread's sockets by broker address; its finalizer closes them when the thread's locals go."""

    def __init__(self) -> None:
        self.by_address: dict[str, BlockingSocket] = {}
        weakref.finalize(self, _close_all, self.by_address, os.getpid())


def _close_all(by_address: dict[str, BlockingSocket], pid: int) -> None:
    if os.getpid() != pid:  # a forked child dropping its copy of the parent's locals: those sockets are not its own
        return
    for sock in by_address.values():
        sock.close()
    by_address.clear()


_local = threading.local()


def _forget_after_fork() -> None:
    global _local
    _local = threading.local()  # the parent's sockets are not this process's to use or close


os.register_at_fork(after_in_child=_forget_after_fork)


def socket_for(address: str) -> BlockingSocket:
    """This thread's socket to ``address``."""
    sockets: _Sockets | None = getattr(_local, "sockets", None)
    if sockets is None:
        sockets = _local.sockets = _Sockets()
    sock = sockets.by_address.get(address)
    if sock is None:
        sock = sockets.by_address[address] = BlockingSocket(address)
    return sock


def close_thread_sockets() -> None:
    """Close this thread's sockets now (tests; a thread's are closed when it ends anyway)."""
    sockets: _Sockets | None = getattr(_local, "sockets", None)
    if sockets is not None:
        _close_all(sockets.by_address, os.getpid())
