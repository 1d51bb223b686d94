"""The persist-queue layer's ``get`` through a real broker takes its record and reads its bytes in one round trip
(``compat._engine.take_records``: a ``take`` with fields), and still returns an item as updated since its put."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zmq

import persisting.compat.persistqueue as persistqueue
from persisting import SyncQueue
from persisting.tensors.arena import peer_id
from persisting.wire import codec, protocol

from .broker_fixture import BrokerProcess


@pytest.mark.parametrize("cls", ["SQLiteAckQueue", "SQLiteQueue"])
def test_get_is_one_take_through_the_broker(tmp_path: Path, broker: BrokerProcess, ops: list[str], cls: str) -> None:
    q = getattr(persistqueue, cls)(str(tmp_path / "pq"), broker=broker.address, auto_commit=True)
    try:
        for item in ("a", "b", "c"):
            q.put(item)
        first = q.get(raw=True)
        assert first["data"] == "a"
        q.update({"pqid": first["pqid"] + 1, "data": "B"})  # b's bytes patched before it is taken
        ops.clear()
        second = q.get(raw=True)
        assert (second["pqid"], second["data"]) == (first["pqid"] + 1, "B")
        assert ops.count("take") == 1 and "get_data" not in ops and "describe" not in ops, ops
        assert q.get() == "c"
        with pytest.raises(persistqueue.Empty):
            q.get(block=False)
    finally:
        q.close()


def _take(request_id: int, batch_size: int, describe: bool) -> list[bytes]:
    args = {"topic": "described", "config": {}, "partition": "p", "task": "t", "batch_size": batch_size, "wait": 0.0}
    args |= {"key": f"k{request_id}", "fields": ["x"], "ready_fields": None, "zerocopy": False, "peer": peer_id()}
    return protocol.encode_request(protocol.Request(request_id, "take", {**args, "describe": describe}))


def test_a_take_of_one_without_descriptions_still_reads_its_rows(broker: BrokerProcess) -> None:
    """``describe: false`` (the layer's get of one record) spares the descriptions, never the rows; a take of
    several is still described (its size is judged by them), and one without the flag as before."""
    with SyncQueue("described", broker=broker.address) as q:
        q.put_batch([{"x": i} for i in range(5)], partition_id="p")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(broker.address)

    def ask(frames: list[bytes]) -> tuple[list[int], list[Any], list[Any]]:
        sock.send_multipart(frames)
        assert sock.poll(10_000), "no reply within 10 s"
        reply = protocol.decode_reply(sock.recv_multipart())
        assert reply.ok, reply
        return reply.result[0], reply.result[1], [row["x"] for row in codec.unpack_reply_rows(reply.buffers[0])]

    try:
        assert ask(_take(1, 1, describe=False)) == ([0], [], [0])
        assert ask(_take(2, 1, describe=True)) == ([1], [[1, {"x": ["int", "", []]}]], [1])
        assert ask(_take(3, 2, describe=False)) == ([2, 3], [[2, {"x": ["int", "", []]}]], [2, 3])
    finally:
        sock.close(linger=0)
