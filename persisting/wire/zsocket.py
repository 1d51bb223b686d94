"""Non-blocking send and receive of whole messages on a plain ZeroMQ socket, at the price of the C calls alone.

pyzmq's ``send_multipart`` / ``recv_multipart`` wrap each frame's C call in Python (an option lookup through an
enum per ``getsockopt``, flag arithmetic on ``IntFlag``s, a check pass over the frames): about 5 us for a one-frame
request and its reply, a tenth of what a whole ``hello`` costs the broker in Python. Both the client's connection
and the broker call the Cython base class's ``send``, ``recv`` and ``get`` directly with plain ints; what goes over
the wire is the same (every frame copied, as ``send_multipart`` does by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq
from zmq.backend import Socket as _CSocket

NOBLOCK, SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
EVENTS, POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)

_send: Callable[..., Any] = _CSocket.send
_recv: Callable[..., Any] = _CSocket.recv
_get: Callable[[Any, int], Any] = _CSocket.get  # an int for the int options used here


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a message waits. Asking costs less than the ``zmq.Again`` of an empty recv, and it is what arms
    the edge-triggered FD again (so whoever sent or received calls it before going back to the loop)."""
    return bool(_get(sock, EVENTS) & POLLIN)


def send(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """Send ``frames`` as one message without blocking (raises ``zmq.Again`` where the queue is full).
    Every frame is checked to be a buffer before the first goes, so a bad one never leaves half a message."""
    last = len(frames) - 1
    if last > 0:
        for frame in frames:
            if type(frame) is not bytes:
                memoryview(frame)  # TypeError now, before any frame of the message is queued
        for i in range(last):
            _send(sock, frames[i], NOBLOCK | SNDMORE)
    _send(sock, frames[last], NOBLOCK)


def recv(sock: zmq.Socket[Any]) -> list[bytes]:
    """The next whole message (raises ``zmq.Again`` if none waits)."""
    first = _recv(sock, NOBLOCK, False)
    return recv_rest(sock, [first.bytes]) if first.more else [first.bytes]


def recv_first(sock: zmq.Socket[Any]) -> Any:
    """The first frame of the next message as a ``zmq.Frame`` (raises ``zmq.Again`` if none waits): its ``more``
    tells whether the rest follows, and it carries the message's properties (``broker/peers.py`` reads the sender
    from them)."""
    return _recv(sock, NOBLOCK, False)


def recv_viewing(sock: zmq.Socket[Any], view_bytes: int, blocking: bool = False) -> list[Any]:
    """The next whole message (raises ``zmq.Again`` if none waits; ``blocking``: waits for one up to the socket's
    RCVTIMEO first, releasing the GIL), a frame after the first of at least
    ``view_bytes`` as a read-only view of its ZeroMQ message: a big frame (a piece's column) is copied once, by
    whoever keeps it (``batches.from_columns``, ``pieces.Gathered``), not first into bytes here. The first frame
    (the envelope) and small ones as bytes: a one-frame reply costs what ``recv`` does."""
    frame = _recv(sock, 0 if blocking else NOBLOCK, False)
    frames: list[Any] = [frame.bytes]
    while frame.more:  # the rest of a message arrives with its first frame
        frame = _recv(sock, NOBLOCK, False)
        frames.append(frame.buffer if len(frame) >= view_bytes else frame.bytes)
    return frames


def recv_rest(sock: zmq.Socket[Any], frames: list[Any]) -> list[Any]:
    """``frames`` (the first of a message, received already, whose frame said more follow) and the rest of that
    message. Each frame's own ``more`` says whether another follows: asking the socket (``RCVMORE``) costs an
    option lookup through pyzmq's enum per frame, about a microsecond."""
    while True:
        frame = _recv(sock, NOBLOCK, False)
        frames.append(frame.bytes)
        if not frame.more:
            return frames
