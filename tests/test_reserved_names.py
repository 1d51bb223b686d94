"""No user key collides with a name the engine uses for itself (issue 37): keys ending in ``#rewrite`` (once the
temporary name of a column rewrite) come back exactly after a reopen; keys ending in ``@payload`` (the
references of deduped fields), keys and partitions under ``_persisting_`` are refused by name, while dedup's own
references still work; a user's idempotency key never names the key rows of a keyed put; embedded and through
a broker restarted on the same storage. A layout rewrite killed between its commits still completes (or is
undone) at open, under its new temporary name; one an earlier version left is ``persisting-broker check``'s.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest

from persisting import Queue
from persisting.errors import InvalidRecordError
from persisting.storage import tensor_columns
from persisting.storage.lance_columns import REWRITE_PREFIX
from persisting.storage.tensor_columns import Layout
from persisting.wire import codec

from .broker_fixture import BrokerProcess
from .rewrite_kill_worker import FIRST, RECORDS, SECOND, STAGES, TOPIC, expected

WORKER = Path(__file__).with_name("rewrite_kill_worker.py")
INTERRUPTED = "finished a column rewrite that was interrupted"


@dataclass
class Where:
    """Where a test's Queues live: ``kw`` opens one; ``restart`` is a reopen (the broker stopped and started)."""

    kw: dict[str, Any]
    restart: Callable[[], None]
    store: Path  # the storage either way
    broker: BrokerProcess | None = None


@pytest.fixture(params=["embedded", "broker"])
def where(request: pytest.FixtureRequest, store: Path) -> Iterator[Where]:
    if request.param == "embedded":
        yield Where({"storage_path": str(store)}, lambda: None, store)
        return
    broker: BrokerProcess = request.getfixturevalue("broker")

    def restart() -> None:
        assert broker.stop() == 0
        broker.start()

    yield Where({"broker": broker.address}, restart, broker.storage, broker)


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """Exactly the same rows: keys, types, values (arrays: dtype and contents)."""
    assert [sorted(r) for r in got] == [sorted(r) for r in want], (got, want)
    for g, w in zip(got, want, strict=True):
        for k, v in w.items():
            if isinstance(v, np.ndarray):
                assert g[k].dtype == v.dtype and np.array_equal(g[k], v), (k, g[k], v)
            else:
                assert type(g[k]) is type(v) and g[k] == v, (k, g[k], v)


def _columns(store: Path, topic: str = TOPIC) -> list[str]:
    return lance.dataset(str(store / topic / "bucket-0.lance")).schema.names


def test_keys_ending_in_rewrite_come_back_after_a_reopen(where: Where, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's two records, and tensor batches whose second sample's shape makes the flush rewrite ``x``
    beside the user's ``x#rewrite``."""

    async def write() -> None:
        async with Queue(TOPIC, **where.kw, num_buckets=1) as q:
            await q.put_batch(RECORDS)
            await q.put(FIRST, partition_id="p")
            await q.flush()
            await q.put(SECOND, partition_id="p")
            await q.flush()
            _same(await q.get(limit=10), expected())

    async def read() -> None:
        async with Queue(TOPIC, **where.kw, num_buckets=1) as q:
            _same(await q.get(limit=10), expected())

    asyncio.run(write())
    where.restart()
    with caplog.at_level(logging.WARNING):
        asyncio.run(read())
    log = caplog.text
    if where.broker is not None:
        assert where.broker.stop() == 0
        log = where.broker.stderr  # the restarted broker's
    assert INTERRUPTED not in log
    names = _columns(where.store)
    # The user's columns are the names an older version gave its temporaries: they are user columns.
    assert {"score%23rewrite", "note%23rewrite", "x%23rewrite"} <= set(names)
    assert not [n for n in names if n.startswith(REWRITE_PREFIX)]
    x = lance.dataset(str(where.store / TOPIC / "bucket-0.lance")).schema.field("x")
    assert x.metadata[b"persisting.layout"] == b"variable_shape_tensor"  # the column was rewritten


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_rewrite_killed_between_its_commits_completes_at_open(
    store: Path, stage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A real SIGKILL just before the rewrite's drop (undone at open) or its rename (completed at open); the
    killed flush's sample comes back from the log, and the user's ``#rewrite`` keys are left alone."""
    proc = subprocess.run([sys.executable, str(WORKER), str(store), stage], capture_output=True, timeout=120)
    assert proc.returncode == -9 and proc.stdout.split() == [b"ACK"], proc.stderr.decode()[-2000:]
    names = _columns(store)
    assert REWRITE_PREFIX + "x" in names and ("x" in names) == (stage == "drop")

    async def read() -> list[dict[str, Any]]:
        async with Queue(TOPIC, storage_path=store, num_buckets=1) as q:
            return await q.get(limit=10)

    with caplog.at_level(logging.WARNING):
        _same(asyncio.run(read()), expected())
    assert f"{INTERRUPTED} (x)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _same(asyncio.run(read()), expected())
    assert INTERRUPTED not in caplog.text
    names = _columns(store)
    assert "x" in names and "x%23rewrite" in names and not [n for n in names if n.startswith(REWRITE_PREFIX)]


REFUSED = r"'mail@payload',? (which )?ends with '@payload' \(reserved for the queue"
IMAGE = np.arange(1024, dtype=np.float32).reshape(32, 32)  # 4 KiB: big enough to dedup (MIN_SAMPLE_BYTES)


def test_keys_ending_in_payload_are_refused_by_name_and_dedup_still_works(where: Where) -> None:
    """Every way a field name gets in: the issue's records, tensor batches, keyed puts, reservations; a client
    that skips the check is refused by the engine. Nothing refused is stored; dedup's own references are."""
    images = {"img": np.stack([IMAGE] * 4), "n": np.arange(4)}

    async def write() -> None:
        async with Queue("pl", **where.kw, num_buckets=1, dedup=["img"]) as q:
            await q.put_batch([{"id": 0, "mail": "a@b.c"}])
            await q.put(images, partition_id="p")
            arr = np.zeros((2, 3), np.float32)
            refused: list[Callable[[], Awaitable[Any]]] = [
                lambda: q.put({"id": 1, "mail@payload": "a@b.c"}),
                lambda: q.put_batch([{"id": 1, "mail@payload": 1}]),
                lambda: q.put_batch([{"id": 1, "mail@payload": None}]),
                lambda: q.put({"mail@payload": arr}, partition_id="p"),
                lambda: q.put({"x": arr, "mail@payload": ["a", "b"]}, partition_id="p"),
                lambda: q.kv_put(["k"], {"x": arr[:1], "mail@payload": [1]}, partition_id="p"),
            ]
            for put in refused:
                with pytest.raises(InvalidRecordError, match=REFUSED):
                    await put()
            with pytest.raises(InvalidRecordError, match=REFUSED.replace("'mail", "reservation field 'mail")):
                await q.reserve({"mail@payload": ((3,), np.float32)}, 2, "p")
            r = await q.reserve({"x": ((3,), np.float32)}, 2, "p")
            r["x"][:] = 1.0
            with pytest.raises(InvalidRecordError, match=REFUSED.replace("'mail", "extra field 'mail")):
                await q.put(r, extra={"mail@payload": [1, 2]})
            await q.abandon(r)
            topic = await q._handle.engine()  # a client that does not check: the engine refuses it by itself
            batch = codec.EncodedBatch([{"mail@payload": 1}], {"mail@payload": "int"})
            with pytest.raises(InvalidRecordError, match=REFUSED):
                await topic.append(batch, "default", codec.pack(batch.rows))
            for partition in ("_persisting_payloads:p", "_persisting_x"):
                with pytest.raises(InvalidRecordError, match="reserved for the queue's own partitions"):
                    await q.put_batch([{"id": 1}], partition_id=partition)
                with pytest.raises(InvalidRecordError, match="reserved for the queue's own partitions"):
                    await q.put({"x": arr}, partition_id=partition)
            with pytest.raises(InvalidRecordError, match="'_persisting_x', which starts with '_persisting_'"):
                await q.put({"_persisting_x": 1})
            await q.put_batch([{"id": 2, "mail": "c@d.e"}])

    async def read() -> None:
        async with Queue("pl", **where.kw, num_buckets=1, dedup=["img"]) as q:
            rows = await q.get(limit=20)  # every row of the topic: the records, the payload row, the samples
            assert len(rows) == 2 + 1 + 4 and not [r for r in rows if "mail@payload" in r]
            _same([r for r in rows if "id" in r], [{"id": 0, "mail": "a@b.c"}, {"id": 2, "mail": "c@d.e"}])
            fields = (await q.stats())["fields"]
            assert "img@payload" in fields and "mail@payload" not in fields
            data, meta = await q.get_batch(["img", "n"], 4, "t", "p")
            assert meta.size == 4 and np.array_equal(data["n"], images["n"])
            assert len(data["img"]) == 4 and all(np.array_equal(v, IMAGE) for v in data["img"])

    asyncio.run(write())
    where.restart()
    asyncio.run(read())


@pytest.mark.parametrize(("stage", "then_put"), [("drop", True), ("rename", False), ("rename", True)])
def test_an_earlier_versions_interrupted_rewrite_is_left_to_check_repair(
    store: Path, stage: str, then_put: bool
) -> None:
    """A store an earlier version left between the commits of a rewrite (temporary ``x%23rewrite``, made here with
    Lance as that version did), maybe written to since: the open leaves it alone (it cannot tell it from a user's
    ``x#rewrite``); ``persisting-broker check`` tells it by the schema (no kind, while ``x`` has one), and
    ``--repair`` finishes or undoes it wherever no value is lost, and ``x`` reads back exactly; where this version
    wrote ``x`` anew after the drop, it says it cannot."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    async def put() -> None:
        async with Queue("old", storage_path=store, num_buckets=1) as q:
            await q.put({"x": x}, partition_id="p")

    asyncio.run(put())
    uri = str(store / "old" / "bucket-0.lance")
    old = Layout.of_field(lance.dataset(uri).schema.field("x"))
    new = Layout(tensor_columns.VARIABLE, "ndarray", "<f4")

    def step(batch: pa.RecordBatch) -> pa.RecordBatch:
        array = tensor_columns.convert(old, new, batch.column(0))
        return pa.RecordBatch.from_arrays([array], schema=pa.schema([new.field("x%23rewrite")]))

    lance.dataset(uri).add_columns(step, read_columns=["x"])
    if stage == "rename":
        lance.dataset(uri).drop_columns(["x"])
    if then_put:
        asyncio.run(put())  # an open and a flush by this version: the column stays as it is
    assert "x%23rewrite" in _columns(store, "old")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "broker", "check", "--storage-path", str(store), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        print(done.stdout, done.stderr)
        return done

    found = check()
    assert found.returncode == 1 and "temporary column of a layout rewrite of 'x'" in found.stdout
    if stage == "rename" and then_put:
        assert "'x' was written anew since: each column holds some rows' values (--repair cannot" in found.stdout
        assert check("--repair").returncode == 1 and "x%23rewrite" in _columns(store, "old")
        return
    assert check("--repair").returncode == 0 and check().returncode == 0

    async def read() -> list[dict[str, Any]]:
        async with Queue("old", storage_path=store, num_buckets=1) as q:
            return await q.get(limit=10)

    _same(asyncio.run(read()), [{"x": x[0]}, {"x": x[1]}] * (2 if then_put else 1))
    assert "x%23rewrite" not in _columns(store, "old")


def test_a_users_idempotency_key_never_names_the_key_rows_of_a_keyed_put(where: Where) -> None:
    """The key rows of a ``kv_put`` keyed ``s`` were put under ``s.keys``: a user's put keyed ``s.keys`` made them
    point at its own sample, and a key of 253+ characters was refused. Now a digest: neither, after a restart too."""

    async def write() -> tuple[list[int], list[int], list[int]]:
        async with Queue("ik", **where.kw, num_buckets=1) as q:
            mine = list(await q.put_batch([{"id": "mine"}], partition_id="p", idempotency_key="s.keys"))
            a = (await q.kv_put(["a"], tags=[{"t": 1}], partition_id="p", idempotency_key="s")).global_indexes
            assert a != mine, "key 'a' was made to name the user's sample"
            again = await q.kv_put(["a"], tags=[{"t": 1}], partition_id="p", idempotency_key="s")
            assert again.global_indexes == a  # a retry: stored once
            b = (await q.kv_put(["b"], tags=[{"t": 2}], partition_id="p", idempotency_key="k" * 256)).global_indexes
            return mine, a, b

    mine, a, b = asyncio.run(write())
    where.restart()

    async def read() -> None:
        async with Queue("ik", **where.kw, num_buckets=1) as q:
            assert await q.kv_list("p") == {"p": {"a": {"t": 1}, "b": {"t": 2}}}
            assert await q.kv_names(mine + a + b, "p") == [None, "a", "b"]
            assert (await q.get(limit=1))[0] == {"id": "mine"}

    asyncio.run(read())
