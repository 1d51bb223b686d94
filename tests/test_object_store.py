"""Topics on object storage (Lance over S3) against a real S3-compatible server process (moto's), and the checks
on storage_path URIs. Needs the ``s3`` extra; skipped without it."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from persisting import Queue
from persisting.engine.location import parse_location
from persisting.errors import ConfigError, StorageError, TopicLockedError
from persisting.testing.s3_server import S3Server, start_s3_server

from .broker_fixture import BrokerProcess, make_broker

LEASE_S = 2.0  # the owner lease in these tests (PERSISTING_OWNER_LEASE_S), so takeovers happen in seconds
REFUSAL_LEASE_S = 5.0  # a lease that a refusal checked right after a kill must fall inside, even under load


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="the s3 extra (moto[server]) runs a local S3 server")
    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket_uri(s3: S3Server) -> str:
    return f"s3://{s3.new_bucket()}/topics"


@pytest.fixture(autouse=True)
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    from persisting.engine import object_store

    monkeypatch.setattr(object_store, "LEASE_SECONDS", LEASE_S)
    monkeypatch.setenv("PERSISTING_OWNER_LEASE_S", str(LEASE_S))  # brokers started by the tests


def records(first: int, n: int) -> list[dict[str, object]]:
    return [
        {"id": i, "text": f"r{i}", "v": np.full(3, i, dtype=np.float32), "tags": [i, "x"]}
        for i in range(first, first + n)
    ]


def check(rows: list[dict[str, object]], n: int) -> None:
    assert [r["id"] for r in rows] == list(range(n))
    for i, r in enumerate(rows):
        assert r["text"] == f"r{i}" and r["tags"] == [i, "x"]
        np.testing.assert_array_equal(r["v"], np.full(3, i, dtype=np.float32))


# -- what storage_path accepts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("s3:/bucket/topics", "s3://bucket/prefix"),
        ("http://example.com/topics", "scheme 'http'"),
        ("s3://", "must name a bucket"),
        ("s3://bucket/topics?versionId=1", "no query"),
        ("file://relative/path", "absolute local path"),
        ("s3+ddb://bucket/t", "scheme 's3+ddb'"),
    ],
)
def test_a_bad_or_unsupported_uri_is_refused_and_creates_nothing(
    path: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=why.replace("?", r"\?").replace("+", r"\+")):
        Queue("obj", storage_path=path)
    assert list(tmp_path.iterdir()) == []  # no folder named 's3:' or 'http:'


def test_options_are_checked_and_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="object-store storage_path"):
        Queue("t", storage_path=tmp_path, storage_options={"region": "x"})
    with pytest.raises(ConfigError, match="local_path applies"):
        Queue("t", storage_path=tmp_path, local_path=tmp_path / "l")
    with pytest.raises(ConfigError, match=r"storage_options\['aws_secret_access_key'\] must be a str"):
        Queue("t", storage_path="s3://b/p", storage_options={"aws_secret_access_key": ["s3cret"]})
    monkeypatch.setenv("PERSISTING_STORAGE_OPTIONS", '{"aws_secret_access_key": "s3cret", "allow_http": true}')
    loc = parse_location("s3://b/p/", local_path=tmp_path)
    assert loc.uri == "s3://b/p" and loc.options == {"aws_secret_access_key": "s3cret", "allow_http": "true"}
    assert "s3cret" not in repr(loc) and "s3cret" not in loc.describe()
    monkeypatch.setenv("PERSISTING_STORAGE_OPTIONS", "{not json")
    with pytest.raises(ConfigError, match="PERSISTING_STORAGE_OPTIONS is not valid JSON"):
        parse_location("s3://b/p")


def test_a_file_uri_is_a_local_folder(tmp_path: Path) -> None:
    async def main() -> None:
        async with Queue("t", storage_path=f"file://{tmp_path}/data") as q:
            await q.put({"id": 1})

    asyncio.run(main())
    assert (tmp_path / "data" / "t" / "topic.json").exists()


def test_a_missing_bucket_is_a_clear_storage_error(s3: S3Server, tmp_path: Path) -> None:
    async def main() -> None:
        async with Queue("t", storage_path="s3://no-such-bucket/t", storage_options=s3.options(), local_path=tmp_path):
            pass

    with pytest.raises(StorageError, match=r"NoSuchBucket|does not exist"):
        asyncio.run(main())


# -- embedded ----------------------------------------------------------------------------------------------------


def test_a_flushed_topic_is_read_back_by_a_fresh_node(s3: S3Server, bucket_uri: str, tmp_path: Path) -> None:
    async def main() -> None:
        opts = s3.options()
        async with Queue("rollouts", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "a") as q:
            await q.put_batch(records(0, 300))
            await q.flush()
            stats = await q.stats()
            assert all(b["uri"].startswith(bucket_uri) for b in stats["buckets"])
        assert not any((tmp_path / "a" / "rollouts").glob("*.lance"))  # nothing flushed stays local
        # Another node: no local state at all.
        async with Queue("rollouts", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "b") as q:
            assert len(q) == 300
            check(await q.get(limit=1000), 300)
            await q.put_batch(records(300, 10))  # indexes go on from the store's
            check(await q.get(limit=1000), 310)
        with pytest.raises(ConfigError, match="num_buckets=4"):  # the settings came from the store too
            async with Queue(
                "rollouts", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "c", num_buckets=2
            ) as q:
                pass

    asyncio.run(main())


def test_a_second_writer_is_refused_until_the_first_lets_go(s3: S3Server, bucket_uri: str, tmp_path: Path) -> None:
    async def main() -> None:
        opts = s3.options()
        first = Queue("t", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "a")
        await first.put({"id": 1})
        second = Queue("t", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "b")
        with pytest.raises(TopicLockedError, match=r"has another writer.*one writer at a time"):
            await second.open()
        await asyncio.sleep(LEASE_S * 1.5)  # renewed meanwhile: still refused
        with pytest.raises(TopicLockedError, match="has another writer"):
            await Queue("t", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "b").open()
        await first.aclose()  # a clean close releases the lease
        async with Queue("t", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "b") as q:
            assert [r["id"] for r in await q.get(limit=10)] == [1]

    asyncio.run(main())


def test_writers_racing_for_a_topic_get_one_lease(s3: S3Server, bucket_uri: str, tmp_path: Path) -> None:
    from persisting.engine.location import object_store_topic

    stores = [
        object_store_topic(parse_location(bucket_uri, s3.options(), tmp_path / f"n{k}"), "t", "t") for k in range(4)
    ]
    barrier = threading.Barrier(len(stores))
    outcome: list[str] = []

    def take(k: int) -> None:
        store = stores[k]
        assert store is not None
        (tmp_path / f"n{k}" / "t").mkdir(parents=True)  # the engine's topic folder, made before attach
        barrier.wait()
        try:
            store.attach(tmp_path / f"n{k}" / "t", {"num_buckets": 4})
            outcome.append("won")
        except TopicLockedError:
            outcome.append("refused")

    threads = [threading.Thread(target=take, args=(k,)) for k in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in stores:
        assert store is not None
        store.detach()
    assert sorted(outcome) == ["refused"] * 3 + ["won"]


def test_a_writer_that_lost_its_lease_stops_writing(s3: S3Server, bucket_uri: str, tmp_path: Path) -> None:
    from persisting.engine import object_store

    async def main() -> None:
        opts = s3.options()
        q = Queue("t", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "a")
        await q.put({"id": 1})
        await q.flush()
        topic = q._handle.opened.engine_topic  # type: ignore[union-attr]
        store = topic._remote
        store.lease._stop.set()  # a writer that stalls (its renewals stop) ...
        store.lease._renewer.join()
        await asyncio.sleep(LEASE_S + 0.5)
        async with Queue("t", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "b") as other:
            await other.put({"id": 2})  # ... loses the topic to another node
            await other.flush()
        await q.put({"id": 3})  # acknowledged by its own log, but never written over the other's rows
        with pytest.raises(StorageError, match=r"lease on topic 't' ran out|took the topic over"):
            await q.flush()
        await topic.close_quietly()  # type: ignore[union-attr]
        q._handle.closed = True
        async with Queue("t", storage_path=bucket_uri, storage_options=opts, local_path=tmp_path / "c") as q3:
            assert [r["id"] for r in await q3.get(limit=10)] == [1, 2]

    assert object_store.LEASE_SECONDS == LEASE_S
    asyncio.run(main())


# -- the broker, kill -9 ---------------------------------------------------------------------------------------


def s3_broker(tmp_path: Path, uri: str, local: str) -> BrokerProcess:
    b = make_broker(tmp_path / local)
    b.extra_args = ["--storage-path", uri, "--local-path", str(tmp_path / local), "--arena-bytes", "0"]
    return b


def test_broker_kill_9_on_s3_loses_nothing_flushed_and_a_fresh_node_serves_it(
    s3: S3Server, bucket_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("PERSISTING_STORAGE_OPTIONS", json.dumps(s3.options()))
    # A's lease must outlive the refused read below on a loaded machine (2 s did not, at load 20)
    monkeypatch.setenv("PERSISTING_OWNER_LEASE_S", str(REFUSAL_LEASE_S))
    a = s3_broker(tmp_path, bucket_uri, "node-a")
    b = s3_broker(tmp_path, bucket_uri, "node-b")

    async def put(address: str, first: int, n: int, flush: bool) -> None:
        async with Queue("t", broker=address) as q:
            for k in range(first, first + n, 50):
                await q.put_batch(records(k, 50))
            if flush:
                await q.flush()

    async def read(address: str) -> list[dict[str, object]]:
        async with Queue("t", broker=address) as q:
            return await q.get(limit=10_000)

    try:
        a.start()
        asyncio.run(put(a.address, 0, 400, flush=True))  # acknowledged and flushed
        asyncio.run(put(a.address, 400, 100, flush=False))  # acknowledged, in node A's log only
        b.start()  # before the kill: B's start-up is not what the lease has to outlive
        a.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        a.proc.wait()  # type: ignore[union-attr]
        killed = time.monotonic()
        # Node B, no local state, while A's lease still runs: refused, clearly.
        with pytest.raises(TopicLockedError, match="has another writer"):
            try:
                asyncio.run(read(b.address))
            finally:
                print(f"B's read came {time.monotonic() - killed:.2f} s after the kill (lease {REFUSAL_LEASE_S} s)")
        asyncio.run(asyncio.sleep(REFUSAL_LEASE_S))
        rows = asyncio.run(read(b.address))  # every flushed record, exactly once, in order
        assert [r["id"] for r in rows[:400]] == list(range(400))
        check(rows[:400], 400)
        assert len({r["id"] for r in rows}) == len(rows) and len(rows) <= 500
        asyncio.run(put(b.address, 1000, 50, flush=True))
        assert b.stop() == 0
        # Node A back: its log is from an older lease (B wrote since), so it is set aside, not replayed over B's rows.
        a.start()
        after = asyncio.run(read(a.address))
        assert [r["id"] for r in after] == [r["id"] for r in rows] + list(range(1000, 1050))
        assert a.stop() == 0
        assert "moved to" in a.stderr and any((tmp_path / "node-a" / "t").glob("stale-*"))
    finally:
        a.ensure_dead()
        b.ensure_dead()


def test_broker_kill_9_on_s3_restarted_on_its_node_keeps_every_acknowledged_record(
    s3: S3Server, bucket_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("PERSISTING_STORAGE_OPTIONS", json.dumps(s3.options()))
    a = s3_broker(tmp_path, bucket_uri, "node-a")

    async def put_then_read(first: int, n: int) -> list[dict[str, object]]:
        async with Queue("t", broker=a.address) as q:
            for k in range(first, first + n, 50):
                await q.put_batch(records(k, 50))
            return await q.get(limit=10_000)

    try:
        a.start()
        asyncio.run(put_then_read(0, 200))
        a.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        a.proc.wait()  # type: ignore[union-attr]
        a.start()  # same node: its lease is its own, taken over at once; its log replays
        check(asyncio.run(put_then_read(200, 100)), 300)
        assert a.stop() == 0
    finally:
        a.ensure_dead()
    assert os.path.exists(tmp_path / "node-a" / "t" / "owner.json")


def test_a_crash_between_taking_its_own_lease_and_recording_it_keeps_the_local_log(
    s3: S3Server, bucket_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from persisting.engine import object_store
    from persisting.engine.location import object_store_topic

    location = parse_location(bucket_uri, s3.options(), tmp_path / "n")
    path = tmp_path / "n" / "t"
    path.mkdir(parents=True)

    def store() -> object_store.TopicStore:
        made = object_store_topic(location, "t", "t")
        assert isinstance(made, object_store.TopicStore)
        return made

    first = store()
    first.attach(path, {"num_buckets": 4})
    first.lease._stop.set()  # killed: never released
    (path / "wal").mkdir()  # its log, with records not yet flushed
    real = object_store.write_json_atomic

    def crash_on_the_record(target: Path, obj: object) -> None:
        if target.name == object_store.LOCAL_OWNER_FILE and isinstance(obj, dict) and "next" not in obj:
            raise KeyboardInterrupt("killed after the commit that took the lease")
        real(target, obj)

    monkeypatch.setattr(object_store, "write_json_atomic", crash_on_the_record)
    with pytest.raises(KeyboardInterrupt):
        store().attach(path, {"num_buckets": 4})
    monkeypatch.setattr(object_store, "write_json_atomic", real)
    again = store()
    again.attach(path, {"num_buckets": 4})  # its own lease (epoch 2, recorded as "next"): the log is current
    again.detach()
    assert (path / "wal").is_dir() and not list(path.glob("stale-*"))
    assert again.lease.epoch == 3
