"""The broker as a real subprocess: many client processes, wake-up, kill -9 recovery, bad input, status."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from persisting import InvalidRecordError, Queue, SchemaConflictError, SyncQueue
from persisting.wire.protocol import PROTOCOL_VERSION

from .broker_fixture import BrokerProcess, make_broker

WORKER = Path(__file__).with_name("broker_client_worker.py")
pytestmark = pytest.mark.slow


@pytest.fixture
def unstarted(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = make_broker(tmp_path)
    try:
        yield b
    finally:
        b.ensure_dead()


@pytest.fixture
def broker(unstarted: BrokerProcess) -> Iterator[BrokerProcess]:
    ready_s = unstarted.start()
    print(f"\nbroker ready in {ready_s * 1000:.0f} ms")
    yield unstarted
    if unstarted.proc is not None and unstarted.proc.poll() is None:
        assert unstarted.stop() == 0


def _client(address: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), address, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def test_clean_stop_flushes_and_removes_the_socket(unstarted: BrokerProcess) -> None:
    b = unstarted
    b.start()
    sock = Path(b.address[len("ipc://") :])
    assert sock.exists() and (sock.stat().st_mode & 0o777) == 0o600  # the service user only
    with SyncQueue("t", broker=b.address, batch_size=10**6) as q:
        q.put_batch([{"id": i} for i in range(100)])
    t0 = time.monotonic()
    assert b.stop() == 0
    print(f"stopped in {time.monotonic() - t0:.2f} s")
    assert not sock.exists()
    assert "stopped cleanly" in b.stderr
    with SyncQueue("t", storage_path=b.storage) as q:  # embedded mode reads what the broker flushed
        assert len(q) == 100 and q.stats()["buffered"] == 0


def test_the_whole_api_through_the_broker(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with Queue("api", broker=broker.address) as q:
            await q.put({"id": 1, "score": 0.5, "tags": ["a", ("b", 2)]})
            await q.put_batch([{"id": i, "score": float(i)} for i in range(2, 102)])
            assert len(q) == 101
            rows = await q.get(limit=2, offset=0)
            assert rows == [{"id": 1, "score": 0.5, "tags": ["a", ("b", 2)]}, {"id": 2, "score": 2.0}]
            assert sum([len(c) async for c in q.stream(limit=1000)]) == 101
            with pytest.raises(InvalidRecordError, match="'score' is stored as float"):
                await q.put({"id": 200, "score": 1})
            with pytest.raises(InvalidRecordError, match="set"):
                await q.put({"id": 201, "s": {1}})
            await q.flush()
            st = await q.stats()
            assert st["total_count"] == 101 and st["flushed"] == 101 and st["broker"] == broker.address
        with SyncQueue("api", broker=broker.address) as sq:
            assert len(sq) == 101

    asyncio.run(main())


def test_a_schema_conflict_found_by_the_broker_comes_back_as_itself(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with Queue("conflict", broker=broker.address) as a, Queue("conflict", broker=broker.address) as b:
            await b.put({"id": 0})  # b has seen the topic's kinds before "score" existed
            await a.put({"id": 1, "score": 0.5})
            with pytest.raises(SchemaConflictError) as caught:
                await b.put({"id": 2, "score": 1})
            assert (caught.value.field, caught.value.stored, caught.value.given) == ("score", "float", "int")
            assert len(a) == 2  # the refused put stored nothing

    asyncio.run(main())


def test_several_producer_and_consumer_processes(broker: BrokerProcess) -> None:
    producers = [_client(broker.address, "produce", "mp", f"p{w}", "2000", "50") for w in range(3)]
    consumers = [_client(broker.address, "consume", "mp", "6000", "20") for _ in range(2)]
    acked: set[str] = set()
    for p in producers:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
        for line in out.decode().splitlines():
            acked.update(line.split()[1:])
    assert len(acked) == 6000
    for c in consumers:
        out, err = c.communicate(timeout=120)
        assert c.returncode == 0, err.decode()[-2000:]
        got = [line.split()[1] for line in out.decode().splitlines() if line.startswith("GOT ")]
        assert len(got) == len(set(got)) == 6000, "a consumer saw a record twice or missed one"
        assert set(got) == acked
        for w in range(3):  # each producer's records stay in its order
            ks = [int(x.split(":")[1]) for x in got if x.startswith(f"p{w}:")]
            assert ks == sorted(ks)


def test_stream_wakes_up_across_processes(broker: BrokerProcess) -> None:
    latencies = []
    with SyncQueue("wake", broker=broker.address) as q:
        for n in range(5):
            waiter = _client(broker.address, "wake", "wake", str(len(q)))
            assert waiter.stdout is not None
            assert waiter.stdout.readline().startswith(b"WAITING")
            time.sleep(0.3)  # let it block in its long-poll
            t0 = time.monotonic()
            q.put({"id": n})
            out, err = waiter.communicate(timeout=30)
            assert waiter.returncode == 0, err.decode()[-2000:]
            woke = float(out.decode().split()[1])
            latencies.append(woke - t0)
    print(f"cross-process wake-up after put returned: {[f'{x * 1000:.2f} ms' for x in latencies]}")
    assert all(x < 5 for x in latencies)  # liveness only: the figure is measured in bench/


def test_many_requests_in_flight_on_one_connection(broker: BrokerProcess) -> None:
    # Replies arrive while others are sent: every one must be picked up (ZeroMQ's socket FD is edge-triggered),
    # and long-polls waiting in the broker must not hold up the puts that wake them.
    async def main() -> None:
        async with Queue("flight", broker=broker.address, durability="process") as q:
            waiters = [asyncio.ensure_future(q.get(limit=1, offset=0)) for _ in range(20)]

            async def one_batch(offset: int) -> list[dict[str, object]]:
                return [r async for rows in q.stream(limit=10, offset=offset, wait=True, timeout=30) for r in rows]

            streams = [asyncio.ensure_future(one_batch(k * 10)) for k in range(30)]
            await asyncio.sleep(0.2)  # the streams are now long-polling in the broker
            await asyncio.gather(*(q.put_batch([{"id": k * 10 + j} for j in range(10)]) for k in range(30)))
            pages = await asyncio.wait_for(asyncio.gather(*streams), 30)
            assert sorted(r["id"] for page in pages for r in page) == list(range(300))  # each batch got 10 indexes
            assert all(len(rows) <= 1 for rows in await asyncio.gather(*waiters))
            assert len(await q.get(limit=1000)) == 300

    asyncio.run(main())


def test_kill_9_of_the_broker_under_load_then_restart(unstarted: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    b = unstarted
    b.start()
    env = {"PERSISTING_REQUEST_TIMEOUT": "120"}  # producers ride out the broker's absence
    producers = [_client(b.address, "produce", "k9", f"p{w}", "20000", "20", env=env) for w in range(2)]
    kills_under_load = 0
    for round_no in range(3):
        time.sleep(rng.uniform(0.3, 1.5))
        alive = sum(p.poll() is None for p in producers)
        b.kill()
        kills_under_load += alive > 0
        print(f"round {round_no}: broker killed with {alive} producers running")
        time.sleep(rng.uniform(0.0, 0.5))
        b.start()
    acked: set[str] = set()
    for p in producers:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-3000:]
        for line in out.decode().splitlines():
            acked.update(line.split()[1:])
    assert kills_under_load >= 1
    assert len(acked) == 40_000  # every put eventually succeeded
    with SyncQueue("k9", broker=b.address) as q:
        ids = [r["id"] for chunk in q.stream() for r in chunk]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} records stored twice"
    assert set(ids) == acked
    assert b.stop() == 0


def test_kill_9_of_a_client_does_not_disturb_others(broker: BrokerProcess) -> None:
    victim = _client(broker.address, "produce", "kc", "victim", "100000", "10")
    time.sleep(1.0)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=30)
    with SyncQueue("kc", broker=broker.address) as q:
        before = len(q)
        q.put({"id": "after"})
        assert len(q) == before + 1


def _raw(address: str, frames: list[bytes], expect_reply: bool = True) -> dict[str, object] | None:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.connect(address)
    try:
        s.send_multipart(frames)
        if not expect_reply:
            return None
        reply = s.recv_multipart()
        env = msgpack.unpackb(reply[0], raw=False)
        assert isinstance(env, dict)
        return env
    finally:
        s.close()


def test_bad_input_gets_error_replies_and_the_broker_keeps_serving(broker: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    v = PROTOCOL_VERSION
    cfg = {"num_buckets": 4}
    cases: list[list[bytes]] = [
        [b"\xc1garbage"],
        [msgpack.packb([1, 2, 3])],
        [msgpack.packb({"v": 999, "id": 1, "op": "hello", "args": {}})],
        [msgpack.packb({"v": v, "id": 2, "op": "drop_tables", "args": {}})],
        [msgpack.packb({"v": v, "id": 3, "op": "read", "args": {"topic": "f", "config": cfg}})],
        [msgpack.packb({"v": v, "id": 4, "op": "read", "args": {"topic": "f", "config": {"num_buckets": "x"}}})],
        [msgpack.packb({"v": v, "id": 5, "op": "put_batch", "args": {"topic": "f", "config": cfg}})],
        [
            msgpack.packb(
                {
                    "v": v,
                    "id": 6,
                    "op": "put_batch",
                    "args": {
                        "topic": "f",
                        "config": cfg,
                        "partition": "p",
                        "kinds": {"a": "int"},
                        "count": 1,
                        "key": "k",
                    },
                }
            ),
            msgpack.packb([{"a": "not an int"}]),
        ],
        [
            msgpack.packb(
                {
                    "v": v,
                    "id": 7,
                    "op": "put_batch",
                    "args": {"topic": "f", "config": cfg, "partition": "p", "kinds": {}, "count": 1, "key": "k2"},
                }
            ),
            msgpack.packb([{"_persisting_index": 5}]),
        ],
        [
            msgpack.packb(
                {"v": v, "id": 8, "op": "wait", "args": {"topic": "f", "config": cfg, "index": 0, "timeout": "soon"}}
            )
        ],
        [
            msgpack.packb(
                {
                    "v": v,
                    "id": 9,
                    "op": "read",
                    "args": {"topic": "f", "config": cfg, "offset": 0, "limit": 1, "wait": "soon"},
                }
            )
        ],
    ]
    for frames in cases:
        env = _raw(broker.address, frames)
        assert env is not None and env["ok"] is False, (frames, env)
        assert env["error"]["message"]  # type: ignore[index]
    for _ in range(200):  # random bytes, random frame counts
        frames = [rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 4))]
        _raw(broker.address, frames, expect_reply=False)
    assert broker.proc is not None and broker.proc.poll() is None
    with SyncQueue("f", broker=broker.address) as q:
        q.put({"a": 1})
        assert q.get() == [{"a": 1}]


def test_a_topic_config_is_checked_on_every_request(broker: BrokerProcess) -> None:
    """The broker remembers configs it checked (broker/topics.py); one that differs only by type (True == 1) or holds
    an unhashable value is still checked, and refused."""

    def read(request_id: int, config: dict[str, object]) -> dict[str, object]:
        args = {"topic": "g", "config": config, "offset": 0, "limit": 1}
        env = _raw(
            broker.address, [msgpack.packb({"v": PROTOCOL_VERSION, "id": request_id, "op": "read", "args": args})]
        )
        assert env is not None
        return env

    assert read(1, {"num_buckets": 1})["ok"] is True
    for request_id, bad in ((2, {"num_buckets": True}), (3, {"num_buckets": [1]}), (4, {"num_buckets": 1.0})):
        env = read(request_id, bad)
        assert env["ok"] is False and "num_buckets" in env["error"]["message"], (bad, env)  # type: ignore[index]
    assert read(5, {"num_buckets": 1})["ok"] is True


def _read_request(request_id: int, offset: int, wait: float | None) -> list[bytes]:
    args = {"topic": "lp", "config": {}, "offset": offset, "limit": 10, "wait": wait}
    return [msgpack.packb({"v": PROTOCOL_VERSION, "id": request_id, "op": "read", "args": args})]


def test_a_read_with_wait_is_a_long_poll(broker: BrokerProcess) -> None:
    with SyncQueue("lp", broker=broker.address) as q:
        q.put({"id": 0})
        t0 = time.monotonic()
        env = _raw(broker.address, _read_request(1, 0, 5.0))  # rows there: answered at once
        assert env is not None and env["ok"] and env["result"]["waited"] is True  # type: ignore[index]
        assert time.monotonic() - t0 < 2.5
        t0 = time.monotonic()
        env = _raw(broker.address, _read_request(2, 1, 0.4))  # nothing at offset 1: answered when the time passes
        assert env is not None and env["ok"] and env["result"]["count"] == 1  # type: ignore[index]
        assert time.monotonic() - t0 >= 0.35

        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        try:
            s.connect(broker.address)
            s.send_multipart(_read_request(3, 1, 20.0))
            assert not s.poll(300)  # held by the broker...
            q.put_batch([{"id": 1}, {"id": 2}])  # ...while other requests (this put) are served
            assert s.poll(10_000)
            frames = s.recv_multipart()
            env = msgpack.unpackb(frames[0], raw=False)
            assert env["id"] == 3 and [r["id"] for r in msgpack.unpackb(frames[1], raw=False)] == [1, 2]
        finally:
            s.close()
            ctx.term()
        # Queue.stream in broker mode rides on it, and still stops once its timeout passes with nothing new.
        t0 = time.monotonic()
        assert [r["id"] for rows in q.stream(offset=1, wait=True, timeout=0.5) for r in rows] == [1, 2]
        assert 0.4 < time.monotonic() - t0 < 5


def test_stream_falls_back_to_wait_with_a_broker_whose_read_does_not_wait(tmp_path: Path) -> None:
    # A stand-in for a broker whose read ignores "wait": it answers at once, without "waited".
    address = f"ipc://{tmp_path}/old.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(address)
    ops: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        visible = 0
        while not stop.is_set():
            if not router.poll(50):
                continue
            identity, envelope, *_ = router.recv_multipart()
            req = msgpack.unpackb(envelope, raw=False)
            ops.append(req["op"])
            buffers: list[bytes] = []
            if req["op"] == "stats":
                result: object = {"fields": {"id": "int"}, "total_count": visible}
            elif req["op"] == "wait":
                visible = 1  # the record "arrives" while the client waits
                result = True
            elif req["op"] == "read":
                offset = req["args"]["offset"]
                rows = [{"id": 7}] if offset < visible else []
                end = offset + len(rows)
                result = {"kinds": {"id": "int"}, "count": visible, "end": end}
                buffers = [msgpack.packb(rows)]
            else:
                result = {}
            reply = {"v": PROTOCOL_VERSION, "id": req["id"], "ok": True, "result": result}
            router.send_multipart([identity, msgpack.packb(reply), *buffers])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:

        async def main() -> list[list[dict[str, object]]]:
            async with Queue("old", broker=address) as q:
                return [rows async for rows in q.stream(limit=1, wait=True, timeout=10)]

        assert asyncio.run(main()) == [[{"id": 7}]]
        assert ops[-3:] == ["read", "wait", "read"]
    finally:
        stop.set()
        thread.join(5)
        router.close()
        ctx.term()


def test_socket_mode_lets_a_group_connect(unstarted: BrokerProcess) -> None:
    unstarted.extra_args = ["--socket-mode", "0660"]
    unstarted.start()
    sock = Path(unstarted.address[len("ipc://") :])
    assert sock.stat().st_mode & 0o777 == 0o660
    assert unstarted.stop() == 0


def test_second_broker_on_the_same_storage_is_refused(broker: BrokerProcess) -> None:
    other = subprocess.run(
        [sys.executable, "-m", "broker", "--storage-path", str(broker.storage), "--socket", broker.address + "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode != 0 and "another broker" in other.stderr


def test_a_socket_it_cannot_listen_on_is_refused_and_its_arena_given_back(tmp_path: Path) -> None:
    """A start that fails after the arena was made (here: an ipc path longer than AF_UNIX takes) says why in one
    line and leaves no shared-memory file behind (it used to leave the whole arena in /dev/shm)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    long_socket = "ipc://" + str(tmp_path / ("s" * 120) / "b.sock")
    out = subprocess.run(
        [sys.executable, "-m", "broker", "--storage-path", str(tmp_path / "storage"), "--socket", long_socket],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PERSISTING_SHM_DIR": str(shm)},
    )
    assert out.returncode != 0
    assert "cannot listen on" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not list(shm.iterdir()), "the arena of a broker that never served is still there"


def test_status_command(broker: BrokerProcess) -> None:
    with SyncQueue("shown", broker=broker.address) as q:
        q.put_batch([{"id": i} for i in range(7)])
    out = subprocess.run(
        [sys.executable, "-m", "broker", "status", "--socket", broker.address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "shown" in out.stdout and " 7 " in out.stdout


def test_a_broker_that_is_down_gives_a_clear_error(tmp_path: Path) -> None:
    code = (
        "from persisting import Queue, BrokerUnavailableError\nimport asyncio\n"
        "async def m():\n"
        "    try:\n"
        f"        await Queue('x', broker='ipc://{tmp_path}/nobody.sock').put({{'id': 1}})\n"
        "    except BrokerUnavailableError as e:\n"
        "        print('UNAVAILABLE', e)\n"
        "asyncio.run(m())\n"
    )
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PERSISTING_REQUEST_TIMEOUT": "1.5"},
    )
    assert out.stdout.startswith("UNAVAILABLE") and "persisting-broker" in out.stdout, out.stderr
    assert time.monotonic() - t0 < 30


def test_a_request_sent_twice_runs_once(broker: BrokerProcess) -> None:
    """A client re-sends a request that has waited long (and again after a reconnect). A take sent twice must
    hand out one batch, not two (the second would be lost): a copy of a take still waiting is dropped, and a
    copy of one already answered gets the same answer."""
    import numpy as np

    from persisting.tensors.arena import peer_id
    from persisting.wire import protocol

    async def put(partition: str) -> None:
        async with Queue("dup", broker=broker.address) as q:
            await q.put({"x": np.arange(16)}, partition_id=partition)

    def take(request_id: int, partition: str, wait: float) -> list[bytes]:
        args = {
            "topic": "dup",
            "config": {},
            "partition": partition,
            "task": "t",
            "batch_size": 4,
            "wait": wait,
            "sampler": None,
            "sampler_kw": {},
            "lease_seconds": None,
            "ready_fields": None,
            "peer": peer_id(),
            "release": [],
        }
        return protocol.encode_request(protocol.Request(request_id, "take", args))

    def replies(sock: zmq.Socket[bytes], within_s: float) -> list[list[int]]:
        got = []
        while sock.poll(int(within_s * 1000)):
            got.append(protocol.decode_reply(sock.recv_multipart()).result[0])
        return got

    asyncio.run(put("a"))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(broker.address)
    try:
        first = take(7, "a", 0.0)
        sock.send_multipart(first)
        assert replies(sock, 1.0) == [[0, 1, 2, 3]]
        sock.send_multipart(first)  # a copy after the answer: the same answer, nothing more taken
        assert replies(sock, 1.0) == [[0, 1, 2, 3]]
        waiting = take(8, "b", 10.0)  # partition b is empty: the take waits in the broker
        sock.send_multipart(waiting)
        time.sleep(0.3)
        sock.send_multipart(waiting)  # a copy while the first still waits: dropped
        asyncio.run(put("b"))
        assert replies(sock, 2.0) == [[16, 17, 18, 19]]
        sock.send_multipart(take(9, "a", 0.0))  # a new request: the next batch
        assert replies(sock, 1.0) == [[4, 5, 6, 7]]
    finally:
        sock.close(linger=0)

    async def consumed() -> dict[str, int]:
        async with Queue("dup", broker=broker.address) as q:
            parts = await q.partitions()
            return {p: info["tasks"]["t"]["consumed"] for p, info in parts.items()}

    assert asyncio.run(consumed()) == {"a": 8, "b": 4}


@pytest.mark.slow
def test_a_waiting_get_meta_carries_on_when_the_broker_restarts(broker: BrokerProcess) -> None:
    """A consumer waiting in get_meta(wait=True) while the broker is killed and restarted: its request is sent
    again as soon as the connection is back (the new broker never saw it), so a put after the restart wakes it
    within seconds, not after the wait's own slice (20 s here) has run out."""
    import numpy as np

    async def main() -> float:
        async with Queue("rw", broker=broker.address) as consumer:
            await consumer.put({"x": np.arange(2)}, partition_id="p")
            assert (await consumer.get_meta(["x"], 2, "t", "p")).size == 2
            waiting = asyncio.ensure_future(consumer.get_meta(["x"], 2, "t", "p", wait=True, timeout=20))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(broker.stop, signal.SIGKILL)
            await asyncio.to_thread(broker.start)
            t0 = time.monotonic()
            async with Queue("rw", broker=broker.address) as producer:
                await producer.put({"x": np.arange(2) + 10}, partition_id="p")
            meta = await asyncio.wait_for(waiting, 30)
            assert meta.global_indexes == [2, 3]
            return time.monotonic() - t0

    woke_after_s = asyncio.run(main())
    assert woke_after_s < 10, f"the waiting get_meta took {woke_after_s:.1f} s after the restart"  # liveness bound


def test_recent_replies_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache of answered requests keeps the newest by count and by bytes, skips a reply too large to keep,
    and a request abandoned by a stopping broker may run again."""
    from broker import replies

    monkeypatch.setattr(replies, "REPLY_CACHE_ENTRIES", 3)
    monkeypatch.setattr(replies, "REPLY_CACHE_BYTES", 100)
    monkeypatch.setattr(replies, "REPLY_CACHE_ONE_BYTES", 60)
    recent = replies.RecentRequests()
    peer = b"id"
    for i in range(5):
        assert recent.start((peer, i)) and not recent.start((peer, i))  # a copy while running is dropped
        recent.done((peer, i), [b"x" * 10])
    assert [recent.answered((peer, i)) is not None for i in range(5)] == [False, False, True, True, True]
    recent.start((peer, 5))
    recent.done((peer, 5), [b"y" * 50])  # 3 x 10 + 50 > 100 bytes: the oldest go
    assert [recent.answered((peer, i)) is not None for i in range(2, 6)] == [False, True, True, True]
    recent.start((peer, 6))
    recent.done((peer, 6), [b"z" * 61])  # over the one-reply limit: answered, not kept
    assert recent.answered((peer, 6)) is None and recent.start((peer, 6))
    recent.abandon((peer, 6))
    assert recent.start((peer, 6))
