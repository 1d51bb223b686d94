"""Tensor batches larger than the arena, the broker's side: a spool file per batch (``persisting.engine``'s
``spooled.py`` holds the file's life; docs/concepts/batch-sizes.md the path each size takes).

    spool_begin  {topic, config, pid}                     -> [name, path of a fresh part file the caller writes]
    spool_where  {topic, config, indexes, fields}         -> {dir, runs} or None: where a get's dense fields lie in
                 spool files (a client the kernel names only: it reads the files itself; tcp clients get None)
    put_spooled  {topic, config, partition, count, kinds, key, name, fields[, of]} + 1 buffer (the non-tensor
                 rows) -> [first, count], once logged, synced and flushed (the file is then deleted)

The producer writes the tensors into the part file itself (same node, the service's group): nothing of the
payload crosses the socket or the arena. Each ``spool_begin`` sweeps part files whose writer is dead.
"""

from __future__ import annotations

from typing import Any

import msgpack

from persisting.engine import Topic, new_spool_part, put_spooled, spool_where, sweep_spool
from persisting.errors import ConfigError, ProtocolError
from persisting.tensors import pieces
from persisting.wire import codec, row_checks
from persisting.wire.protocol import Reply, Request, arg

from .givebacks import int_list

OPS = frozenset({"spool_begin", "put_spooled", "spool_where"})


async def handle(req: Request, topic: Any, peer: Any) -> Reply:
    if not isinstance(topic, Topic):
        raise ConfigError("batches larger than the arena need a topic on local disk (the spool file lies beside it)")
    if req.op == "spool_begin":
        pid = peer[0] if peer is not None else arg(req, "pid", int)  # the kernel's word first
        sweep_spool(topic.path, None)
        name, path = new_spool_part(topic.path, int(pid))
        return Reply(req.id, True, [name, str(path)])
    if req.op == "spool_where":
        fields = req.args.get("fields")
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise ProtocolError("spool_where fields must be a list of str")
        if peer is None:  # a tcp client (or no kernel credentials): it may not be on this node, reads copies
            return Reply(req.id, True, None)
        return Reply(req.id, True, await spool_where(topic, int_list(req.args.get("indexes"), "indexes"), fields))
    key = req.args.get("key")
    if isinstance(key, str):
        done = await topic.recall(key)  # a re-sent put whose first attempt stored the batch
        if done is not None:
            return Reply(req.id, True, list(done))
    count, partition = arg(req, "count", int), arg(req, "partition", str)
    kinds, name = arg(req, "kinds", dict), arg(req, "name", str)
    if len(req.buffers) != 1 or (key is not None and not isinstance(key, str)) or count < 1:
        raise ProtocolError("put_spooled needs one rows buffer, a str key (or none) and a count >= 1")
    try:
        other = msgpack.unpackb(req.buffers[0], raw=False, use_list=True)
    except Exception as exc:
        raise ProtocolError(f"put_spooled rows are not valid msgpack: {exc}") from exc
    rows = row_checks.check_rows(other, kinds, count)
    of = None if req.args.get("of") is None else int_list(req.args["of"], "of")
    batch = codec.EncodedBatch(rows, kinds)
    first, n = await put_spooled(topic, batch, partition, req.buffers[0], key, name, req.args.get("fields"), of)
    return Reply(req.id, True, [first, n])


def too_big(indexes: list[int], described: list[list[Any]], fields: list[str], arena_bytes: int | None) -> bool:
    """Whether a get_batch's data is larger than the arena takes: then its reply carries the meta only and the
    client asks for the data in pieces (``tensors/pieces.py``), so no reply holds more than a piece."""
    if len(indexes) <= 1:
        return False
    # Sized per run from the descriptions: a meta per sample (meta_from) cost ~1/5 of the broker's time per
    # get_batch in `bench arena`.
    covered = sum(int(run[0]) for run in described)
    if covered != len(indexes):
        raise ProtocolError(f"field descriptions cover {covered} samples, not {len(indexes)}")
    return pieces.described_bytes(described, fields) > pieces.spool_above(arena_bytes)
