"""What a request handler is given: the request (``Call``: its id, its decoded arguments, its buffers, who sent
it, the topic it names) and the broker's services it may use (``Services``, which the Broker implements).

The contract: a handler is ``async def handler(services, call) -> Reply``. It runs on the broker's loop, may
await, and raises a ``PersistingError`` for anything the client should hear (``ProtocolError`` for a bad argument:
counted as a bad request by complaints.py); its arguments were decoded and type-checked before it runs, and the
topic is open when its route says it needs one. It never sends: the server encodes and sends what it returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from persisting.engine import Topic
from persisting.errors import ProtocolError
from persisting.tensors.arena import Peer
from persisting.wire.protocol import Reply
from persisting.wire.requests import Args

from ..tensor_memory import TensorMemory

A = TypeVar("A", bound=Args)


@dataclass(slots=True)
class Call(Generic[A]):
    id: int
    op: str
    args: A
    buffers: list[bytes] = field(default_factory=list)
    peer: Peer | None = None  # the sender as the kernel names it (broker/peers.py); None where it does not say
    topic_or_none: Topic | None = None
    identity: bytes = b""  # the sender's connection (ZeroMQ routing id)

    @property
    def topic(self) -> Topic:
        """The topic the request names, opened by the dispatch (its route says it needs one)."""
        if self.topic_or_none is None:
            raise ProtocolError(f"{self.op} needs a topic")
        return self.topic_or_none

    def ok(self, result: Any = None, buffers: list[bytes] | None = None) -> Reply:
        return Reply(self.id, True, result, buffers=[] if buffers is None else buffers)


class Services(Protocol):
    """What of the broker a handler may use."""

    @property
    def memory(self) -> TensorMemory: ...

    @property
    def topics(self) -> dict[str, Topic]: ...

    async def state(self) -> dict[str, Any]: ...

    def hello(self, call: Call[Any]) -> Reply: ...


Handler = Callable[[Services, Call[Any]], Awaitable[Reply]]
