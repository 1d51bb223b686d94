"""persisting.compat.transfer_queue: how many broker round trips in a row each KV call waits for (one: the key
index lives in the broker's engine), and that every call acts on what the keys name now when another process
cleared or re-created them (no process keeps a key map that could be stale)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tq(tmp_path: Path) -> Iterator[Any]:
    pytest.importorskip("tensordict")
    import persisting.compat.transfer_queue as tq

    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tqr-")
    try:
        tq.init({"persisting": {"storage_path": str(tmp_path / "data"), "arena_bytes": 16 << 20}})
        yield tq
    finally:
        tq.close()
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old


def _jagged(n: int, base: int = 0) -> Any:
    import torch

    return torch.nested.as_nested_tensor([torch.arange(3 + i) + base for i in range(n)], layout=torch.jagged)


def _fields(name: str, n: int, base: int = 0) -> Any:
    from tensordict import TensorDict

    return TensorDict({name: _jagged(n, base)}, batch_size=[n])


class RoundTrips:
    """Counts the broker round trips a call waits for one after the other: a request sent while none is in
    flight starts the next one (requests sent together, awaited together, count once). A ``release`` (views
    given back on a timer, whenever the garbage collector drops them) is no call's round trip."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from persisting.client.connection import Connection

        self.in_flight = 0
        self.in_a_row = 0
        original = Connection.request

        async def request(conn: Connection, op: str, *args: Any, **kwargs: Any) -> Any:
            if op == "release":  # arena views given back on a timer: no call waits for it
                return await original(conn, op, *args, **kwargs)
            if self.in_flight == 0:
                self.in_a_row += 1
            self.in_flight += 1
            try:
                return await original(conn, op, *args, **kwargs)
            finally:
                self.in_flight -= 1

        monkeypatch.setattr(Connection, "request", request)

    def of(self, call: Callable[[], Any]) -> int:
        self.in_a_row = 0
        call()
        return self.in_a_row


def test_kv_calls_wait_for_few_round_trips(tq: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [f"k{i}" for i in range(4)]
    warm = _fields("a", 1)
    warm["b"], warm["c"] = _jagged(1), _jagged(1)
    # connects; and the fields are known: persisting.dedup "auto" looks a field this process has not seen up in
    # the topic once (one round trip more, the first time: another process may have stored it deduped)
    tq.kv_batch_put(keys=["warm"], partition_id="p", fields=warm, tags=[{"s": 0}])
    trips = RoundTrips(monkeypatch)
    # every KV call is one engine call, one round trip: new keys (data, keys and tags together), known keys
    # (verl's tag updates, the trainer's column writes), a mix, reads with or without select_fields, list, clear
    new_keys = _fields("a", 4)
    assert trips.of(lambda: tq.kv_batch_put(keys=keys, partition_id="p", fields=new_keys, tags=[{"s": 1}] * 4)) == 1
    assert trips.of(lambda: tq.kv_put(key="k0", partition_id="p", tag={"s": 2})) == 1
    assert trips.of(lambda: tq.kv_batch_put(keys=keys, partition_id="p", fields=_fields("b", 4))) == 1
    mixed = ["k3", "k4"]
    assert trips.of(lambda: tq.kv_batch_put(keys=mixed, partition_id="p", fields=_fields("c", 2), tags=[{}] * 2)) == 1
    got: dict[str, Any] = {}
    assert trips.of(lambda: got.update(td=tq.kv_batch_get(keys=keys, partition_id="p", select_fields=["b"]))) == 1
    assert got["td"]["b"].offsets().tolist() == [0, 3, 7, 12, 18]
    assert trips.of(lambda: got.update(td=tq.kv_batch_get(keys=keys, partition_id="p"))) == 1
    assert sorted(got["td"].keys()) == ["a", "b"]
    assert trips.of(lambda: got.update(listed=tq.kv_list("p"))) == 1
    assert list(got["listed"]["p"]) == ["warm", *keys, "k4"]
    assert trips.of(lambda: tq.kv_clear(keys=[*keys, "k4"], partition_id="p")) == 1


ELSEWHERE = """
import sys
import torch
from tensordict import TensorDict
import persisting.compat.transfer_queue as tq
tq.init()
tq.kv_clear(keys=["k0", "k1"], partition_id="p")
nt = torch.nested.as_nested_tensor([torch.arange(4) + 100], layout=torch.jagged)
tq.kv_batch_put(keys=["k0"], partition_id="p", fields=TensorDict({"a": nt}, batch_size=[1]), tags=[{"v": 1}])
tq.close()
"""


def test_a_stale_key_map_acts_on_what_the_keys_name_now(tq: Any) -> None:
    """This process knows k0 and k1; another clears both and creates k0 again. Every call here then acts on the
    new k0 (its tag, its columns) and finds k1 gone, as if it had caught up first."""
    tq.kv_batch_put(keys=["k0", "k1"], partition_id="p", fields=_fields("a", 2), tags=[{"v": 0}, {"v": 0}])
    assert sorted(tq.kv_list("p")["p"]) == ["k0", "k1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", ELSEWHERE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    meta = tq.kv_put(key="k0", partition_id="p", tag={"w": 2})
    assert meta.tags == [{"v": 1, "w": 2}]  # the new k0's tag, not the cleared one's
    assert tq.kv_batch_get(keys=["k0"], partition_id="p", select_fields=["a"])["a"].values().tolist() == [
        100,
        101,
        102,
        103,
    ]
    with pytest.raises(ValueError, match="not found"):
        tq.kv_batch_get(keys=["k1"], partition_id="p", select_fields=["a"])
    tq.kv_batch_put(keys=["k0"], partition_id="p", fields=_fields("b", 1, base=7))
    got = tq.kv_batch_get(keys=["k0"], partition_id="p", select_fields=["a", "b"])
    assert got["b"].values().tolist() == [7, 8, 9]
    meta = tq.kv_put(key="k1", partition_id="p", tag={"w": 3})  # k1 was cleared: created again, empty tag
    assert meta.tags == [{"w": 3}]
    assert tq.kv_list("p")["p"] == {"k0": {"v": 1, "w": 2}, "k1": {"w": 3}}


def test_a_cleared_partition_is_gone_from_kv_list(tq: Any) -> None:
    """TransferQueue drops a partition from ``kv_list()`` once ``clear_partition`` cleared it (its controller
    forgets the partition); ``kv_clear`` of every key leaves the partition listed, empty, in both."""
    tq.kv_batch_put(keys=["k0", "k1"], partition_id="gone", fields=_fields("a", 2), tags=[{"v": 0}, {"v": 1}])
    tq.kv_batch_put(keys=["k2"], partition_id="emptied", fields=_fields("a", 1))
    tq.kv_batch_put(keys=["k3"], partition_id="kept", fields=_fields("a", 1), tags=[{"v": 3}])
    tq.kv_clear(keys=["k2"], partition_id="emptied")
    tq.get_client().clear_partition("gone")
    assert tq.kv_list() == {"emptied": {}, "kept": {"k3": {"v": 3}}}
    assert tq.kv_list("gone") == {}
    with pytest.raises(ValueError, match="not found"):
        tq.kv_batch_get(keys=["k0"], partition_id="gone")
    tq.kv_put(key="k0", partition_id="gone", tag={"again": 1})  # a key put again: the partition is back, anew
    assert tq.kv_list("gone") == {"gone": {"k0": {"again": 1}}}
