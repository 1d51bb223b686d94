"""The persist-queue layer's ``get`` through a real broker takes its record and reads its bytes in one round trip
(``compat._engine.take_records``: a ``take`` with fields), and still returns an item as updated since its put."""

from __future__ import annotations

from pathlib import Path

import pytest

import persisting.compat.persistqueue as persistqueue

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
