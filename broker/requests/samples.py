"""Requests about samples: their descriptions and data, a task's consumption, clears, partitions, tags. They work
without an arena too (data then comes as copies); holds and leases a client gives back ride on them (the
dispatch applies those first, broker/givebacks.py)."""

from __future__ import annotations

from persisting.wire.protocol import Reply
from persisting.wire.requests import Clear, Consumption, GetData, GiveBack, Indexes, MarkConsumed, Partitions, SetTags

from . import reads, riders
from .context import Call, Services


async def describe(services: Services, call: Call[Indexes]) -> Reply:
    return call.ok(await call.topic.describe(call.args.indexes))


async def get_data(services: Services, call: Call[GetData]) -> Reply:
    args = call.args
    data, buffers = await reads.data(
        services.memory,
        call.topic,
        call.peer,
        args.indexes,
        args.fields,
        zerocopy=args.zerocopy,
        columns_wanted=args.columns,
        views_only=args.views_only,
    )
    return call.ok(data, buffers)


async def mark_consumed(services: Services, call: Call[MarkConsumed]) -> Reply:
    """The samples consumed by the task; with ``then_put``, its rows appended after (riders.py)."""
    args, topic = call.args, call.topic
    spec = args.then_put
    batch = None if spec is None else riders.then_put_rows(call.op, spec, call.buffers)
    await topic.mark_consumed(args.partition, args.task, args.indexes)
    if spec is None or batch is None:
        return call.ok(None)
    return call.ok(await riders.write_then_put(topic, spec, batch, call.buffers[0]))


async def give_back(services: Services, call: Call[GiveBack]) -> Reply:
    call.topic.give_back(call.args.partition, call.args.task, call.args.indexes)
    return call.ok(None)


async def reset_consumption(services: Services, call: Call[Consumption]) -> Reply:
    call.topic.reset_consumption(call.args.partition, call.args.task)
    return call.ok(None)


async def clear(services: Services, call: Call[Clear]) -> Reply:
    return call.ok(await call.topic.clear(call.args.partition, call.args.indexes))


async def partitions(services: Services, call: Call[Partitions]) -> Reply:
    return call.ok(await call.topic.partitions())


async def set_tags(services: Services, call: Call[SetTags]) -> Reply:
    await call.topic.set_tags(call.args.partition, [(item.index, item.tags) for item in call.args.items])
    return call.ok(None)
