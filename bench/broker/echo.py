"""The raw ZeroMQ echo the ``broker`` suite's latency series measure against: the echo server (a spawned process;
blocking, or served on an event loop the way the broker serves), how to stop it, and ``LoopEcho``, the echo read
the way persisting's client reads its replies."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import zmq

from persisting.wire import zsocket


class LoopEcho:
    """The raw echo read as persisting's client reads replies (client/connection.py): a plain DEALER, NOBLOCK send
    and receive, a loop reader callback that resolves the awaiting future; no envelope, no broker."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fut: asyncio.Future[list[bytes]] | None = None

    async def roundtrip(self, frame: bytes) -> list[bytes]:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self.sock.fileno(), self._drain)
        fut = self._fut = loop.create_future()
        zsocket.send(self.sock, [frame])
        if zsocket.readable(self.sock):  # the send may have taken the edge of a waiting reply
            loop.call_soon(self._drain)
        return await fut

    def _drain(self) -> None:
        while zsocket.readable(self.sock):
            frames = zsocket.recv(self.sock)
            if self._fut is not None and not self._fut.done():
                self._fut.set_result(frames)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close(linger=0)


def echo_server_main(address: str, on_loop: bool = False) -> None:
    """A ROUTER that sends every message straight back (frames untouched) until it gets the frame b"stop".

    ``on_loop``: served the way the broker serves (broker/server.py): on uvloop where installed, a loop reader on the
    socket's FD draining with NOBLOCK, the edge re-armed by asking for EVENTS; no request handling at all. What a
    request costs above this echo is the broker's own work; what this echo costs above the blocking one is the
    event loop's wake-up, which a server of many clients and its own I/O completions pays."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    if on_loop:
        try:
            _serve_on_loop(sock)
        finally:
            sock.close(linger=0)
            ctx.term()
        return
    try:
        while True:
            frames = sock.recv_multipart(copy=True)
            if frames[1:] == [b"stop"]:
                sock.send_multipart(frames)
                return
            sock.send_multipart(frames)
    finally:
        sock.close(linger=0)
        ctx.term()


def _serve_on_loop(sock: zmq.Socket[bytes]) -> None:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()

    def drain() -> None:
        while zsocket.readable(sock):
            frames = sock.recv_multipart(zmq.NOBLOCK)
            sock.send_multipart(frames, zmq.NOBLOCK)
            if frames[1:] == [b"stop"]:
                loop.stop()
                return

    loop.add_reader(sock.fileno(), drain)
    loop.call_soon(drain)  # messages that came before the reader raise no new edge
    try:
        loop.run_forever()
    finally:
        loop.remove_reader(sock.fileno())
        loop.close()


def stop_echo(echo: Any, address: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        sock.connect(address)
        sock.send(b"stop")
        with contextlib.suppress(zmq.Again):  # no reply: it is stopped below all the same
            sock.recv()
    finally:
        sock.close(linger=0)
        ctx.term()
    echo.join(10)
    if echo.is_alive():
        echo.terminate()
        echo.join(5)
