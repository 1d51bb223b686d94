"""Requests about the broker itself: ``hello`` (what a client needs to know first), ``status`` (the state map,
broker/status.py) and ``topics`` (each open topic's stats)."""

from __future__ import annotations

from persisting.wire.protocol import Reply
from persisting.wire.requests import Hello, NoArgs

from .context import Call, Services


async def hello(services: Services, call: Call[Hello]) -> Reply:
    return services.hello(call)


async def status(services: Services, call: Call[NoArgs]) -> Reply:
    return call.ok(await services.state())


async def topics(services: Services, call: Call[NoArgs]) -> Reply:
    return call.ok([await topic.stats() for topic in list(services.topics.values())])
