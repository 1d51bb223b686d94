"""The broker's request table: every operation a client may send, its handler, its argument struct and its reply.

The one route of every request: the server decodes the envelope, looks the operation up here (one dict lookup),
decodes its ``args`` straight into the struct (``Route.decode``: once, typed; a refusal is the ``ProtocolError``
the client gets, counted by complaints.py), opens the topic the route needs, gives back what rides along
(broker/givebacks.py) and awaits the handler. docs/reference/protocol.md is generated from this table
(``python -m broker.requests.doc``) and tests/test_protocol_doc.py checks that it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from persisting.errors import ProtocolError
from persisting.wire import replies as r
from persisting.wire import requests as q

from . import about, kv, records, samples, spool, take, tensors
from .context import Handler


@dataclass(frozen=True, slots=True)
class Route:
    """One operation: ``args`` its argument struct, ``reply`` what its result is (a struct of wire/replies.py,
    or a plain type), ``doc`` one line on what it does."""

    op: str
    handler: Handler
    args: type[q.Args]
    reply: Any
    doc: str
    cached: bool = True  # a copy of the request sent again is answered from the reply cache (broker/replies.py)
    topic: bool = field(init=False)  # the dispatch opens the topic the args name
    givebacks: bool = field(init=False)  # holds and leases ride along (applied before the handler)
    dedup_counted: bool = field(init=False)  # a put whose dedup savings the status map counts (broker/status.py)
    _decode: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "topic", issubclass(self.args, q.TopicArgs | q.SampleArgs))
        object.__setattr__(self, "givebacks", issubclass(self.args, q.GivebackArgs))
        object.__setattr__(self, "dedup_counted", issubclass(self.args, q.PutBatch | q.PutTensors))
        object.__setattr__(self, "_decode", msgspec.msgpack.Decoder(self.args).decode)

    def decode(self, raw: Any) -> q.Args:
        """The request's arguments as this route's struct: from the envelope's raw ``args`` (the broker's path),
        or from a map (an in-process caller)."""
        try:
            # a map from an in-process caller goes through its msgpack bytes too (a topic's config stays those)
            return self._decode(raw if isinstance(raw, msgspec.Raw) else msgspec.msgpack.encode(raw))
        except msgspec.ValidationError as exc:
            raise q.args_error(self.op, exc) from exc
        except (msgspec.DecodeError, msgspec.EncodeError, TypeError) as exc:  # (TypeError: a map msgpack cannot hold)
            raise ProtocolError(f"operation {self.op!r}: args are not valid msgpack ({exc})") from exc


ROUTES = (
    Route(
        "hello",
        about.hello,
        q.Hello,
        dict,
        "a client's first request: {broker, pid, storage_path, max_message_bytes, arena (its path, size_bytes, "
        "generation, largest_batch_bytes; empty where the kernel does not name the client), event_loop, features, "
        "arena_stats}",
        cached=False,
    ),
    Route("status", about.status, q.NoArgs, dict, "the broker's state (what `persisting-broker status --json` prints)"),
    Route("topics", about.topics, q.NoArgs, list, "the stats of every open topic"),
    Route("put_batch", records.put_batch, q.PutBatch, r.Range, "append rows (1 buffer: msgpack rows)"),
    Route("read", records.read, q.Read, r.Read, "a page of records (+1 buffer: rows); a long-poll with wait"),
    Route("wait", records.wait, q.Wait, bool, "whether a record with index >= index is visible (within timeout)"),
    Route("flush", records.flush, q.TopicOnly, None, "return once every acknowledged record is in Lance"),
    Route("stats", records.stats, q.TopicOnly, dict, "the topic's stats"),
    Route("count", records.count, q.TopicOnly, int, "records visible"),
    Route(
        "take",
        take.take,
        q.Take,
        r.Taken | r.TakenNoted | r.TakenWithData | r.TakenWithDataNoted,
        "samples handed to a task (get_meta); with fields their data too (get_batch)",
    ),
    Route("describe", samples.describe, q.Indexes, list, "field descriptions of runs of samples alike"),
    Route("get_data", samples.get_data, q.GetData, r.Data, "the samples' data: views, copies or later"),
    Route("mark_consumed", samples.mark_consumed, q.MarkConsumed, r.Range | None, "samples consumed by a task"),
    Route("give_back", samples.give_back, q.GiveBack, None, "leases of a task end unconsumed"),
    Route("reset_consumption", samples.reset_consumption, q.Consumption, None, "a task starts over"),
    Route("clear", samples.clear, q.Clear, int, "samples cleared (nil indexes: the partition); newly cleared"),
    Route("partitions", samples.partitions, q.Partitions, dict, "{partition: {samples, cleared, tasks}}"),
    Route("set_tags", samples.set_tags, q.SetTags, None, "tags merged into samples (durable)"),
    Route("lease", tensors.lease, q.Lease, r.Extent, "an extent of the arena for a producer to write"),
    Route("release", tensors.release, q.Release, bool, "a hold given back (and what rides along)"),
    Route(
        "put_tensors",
        tensors.put_tensors,
        q.PutTensors,
        r.Range | r.RangeLeased | r.KeyedTensorRange,
        "the batch a producer wrote in its extent (1 buffer: the non-tensor rows)",
    ),
    Route("kv_put", kv.kv_put, q.KvPut, r.KeyedRange, "samples by key (optional 1 buffer: rows)"),
    Route("kv_get", kv.kv_get, q.KvGet, r.KeyedSamples, "the keys' samples, and their data when read"),
    Route("kv_list", kv.kv_list, q.KvList, dict, "{partition: {key: tags}}"),
    Route("kv_clear", kv.kv_clear, q.KvKeys, int, "the keys' samples cleared; how many"),
    Route("kv_names", kv.kv_names, q.KvNames, list, "the key (or nil) of each sample"),
    Route("spool_begin", spool.spool_begin, q.SpoolBegin, r.SpoolPart, "a fresh spool part file to write"),
    Route("spool_where", spool.spool_where_, q.SpoolWhere, dict | None, "where dense fields lie in spool files"),
    Route("put_spooled", spool.put_spooled_, q.PutSpooled, r.Range, "a batch in a spool file (1 buffer: rows)"),
)
TABLE: dict[str, Route] = {route.op: route for route in ROUTES}
