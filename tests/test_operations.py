"""Operating the broker (a real subprocess): Prometheus metrics, the status command, log hygiene under a flood."""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from persisting import SyncQueue
from persisting.wire.protocol import PROTOCOL_VERSION

from .broker_fixture import BrokerProcess, make_broker

pytestmark = pytest.mark.slow


@pytest.fixture
def unstarted(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = make_broker(tmp_path)
    try:
        yield b
    finally:
        b.ensure_dead()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape_tcp(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return _parse(r.read().decode())


def _scrape_unix(path: str) -> dict[str, float]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head
    assert b"text/plain" in head
    return _parse(body.decode())


def _parse(text: str) -> dict[str, float]:
    """Series line -> value (series written as in the exposition, labels sorted by prometheus_client)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def _status(address: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "status", "--socket", address, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_metrics_over_tcp_and_unix_move_with_the_traffic(unstarted: BrokerProcess, tmp_path: Path) -> None:
    port = _free_port()
    unstarted.extra_args = ["--metrics", str(port), "--arena-bytes", str(16 * 2**20)]
    unstarted.start()
    before = _scrape_tcp(port)
    assert before["persisting_state_up"] == 1
    assert before['persisting_bad_frames_total{kind="malformed"}'] == 0
    assert before['persisting_arena_bytes{state="size"}'] == 16 * 2**20
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    with SyncQueue("m", broker=unstarted.address, durability="process") as q:
        q.put({"x": x}, partition_id="p")
        q.put_batch([{"id": i} for i in range(10)], partition_id="rows")
        data, meta = q.get_batch(["x"], batch_size=24, task_name="train", partition_id="p")
        assert meta.size == 24
        q.get_meta(batch_size=8, task_name="ack", partition_id="p", delivery="ack")
        q.flush()
        during = _scrape_tcp(port)
        del data
    assert during['persisting_put_samples_total{partition="p",topic="m"}'] == 64
    assert during['persisting_put_samples_total{partition="rows",topic="m"}'] == 10
    assert during['persisting_put_bytes_total{partition="p",topic="m"}'] >= x.nbytes
    assert during['persisting_taken_samples_total{partition="p",task="train",topic="m"}'] == 24
    assert during['persisting_get_data_bytes_total{topic="m"}'] >= 24 * 32 * 4
    assert during['persisting_task_backlog_samples{partition="p",task="train",topic="m"}'] == 40
    assert during['persisting_task_leased_samples{partition="p",task="ack",topic="m"}'] == 8
    assert during['persisting_task_backlog_samples{partition="p",task="ack",topic="m"}'] == 56
    assert during['persisting_partition_samples{partition="p",topic="m"}'] == 64
    assert during['persisting_flush_seconds_count{topic="m"}'] >= 1
    assert during['persisting_flush_records_sum{topic="m"}'] == 74
    assert during['persisting_unflushed_records{topic="m"}'] == 0
    assert during['persisting_wal_bytes{topic="m"}'] >= 0
    assert during['persisting_request_seconds_count{op="put_tensors"}'] == 1
    assert during["persisting_connected_clients"] >= 1
    assert during["persisting_client_processes"] == 1  # this process said hello
    assert during['persisting_arena_bytes{state="used"}'] >= x.nbytes
    assert unstarted.stop() == 0

    # the same registry over a unix socket (what the systemd unit uses)
    path = str(tmp_path / "metrics.sock")
    unstarted.extra_args = ["--metrics", f"unix:{path}"]
    unstarted.start()
    with SyncQueue("m", broker=unstarted.address) as q:
        q.put_batch([{"id": 1}])
        scraped = _scrape_unix(path)
    assert scraped['persisting_put_samples_total{partition="default",topic="m"}'] == 1
    assert scraped['persisting_topic_records{topic="m"}'] == 75
    assert unstarted.stop() == 0
    assert not Path(path).exists()  # removed at a clean stop


def test_status_shows_partitions_tasks_leases_and_clients(unstarted: BrokerProcess) -> None:
    unstarted.extra_args = ["--arena-bytes", str(8 * 2**20)]
    unstarted.start()
    with SyncQueue("s", broker=unstarted.address) as q:
        q.put({"x": np.zeros((10, 4), np.float32)}, partition_id="step-1")
        q.get_meta(batch_size=3, task_name="train", partition_id="step-1")
        q.get_meta(batch_size=2, task_name="critic", partition_id="step-1", delivery="ack", lease_seconds=30)
        q.put_batch([{"id": 1}])
        out = _status(unstarted.address, "--json")
        text = _status(unstarted.address)
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert set(state) == {"broker", "topics", "arena", "connections", "clients", "bad_frames"}
    assert state["broker"]["protocol"] == PROTOCOL_VERSION
    (topic,) = state["topics"]
    assert topic["name"] == "s" and topic["records"] == 11
    assert topic["unflushed_records"] + topic["flushed"] == 11
    assert topic["flush_lag_s"] >= 0 and topic["wal_bytes"] > 0
    tasks = topic["partitions"]["step-1"]["tasks"]
    assert tasks["train"] == {"consumed": 3, "leased": 0, "backlog": 7}
    assert tasks["critic"] == {"consumed": 0, "leased": 2, "backlog": 8}
    assert topic["partitions"]["default"]["samples"] == 1
    assert state["arena"]["size_bytes"] == 8 * 2**20 and state["arena"]["used_bytes"] > 0
    assert [c["pid"] for c in state["clients"]] == [__import__("os").getpid()]
    assert state["connections"]["connected"] >= 1
    assert state["bad_frames"] == {"malformed": 0, "version": 0, "bad_request": 0}
    assert text.returncode == 0, text.stderr
    assert "task 'train': backlog 7, consumed 3, leased 0" in text.stdout
    assert "task 'critic': backlog 8, consumed 0, leased 2" in text.stdout
    assert "partition 'step-1': 10 samples" in text.stdout and "connections:" in text.stdout
    assert unstarted.stop() == 0
    down = _status(unstarted.address, "--json")
    assert down.returncode == 1 and "no broker listens" in down.stderr and down.stdout == ""


def test_a_flood_of_bad_frames_logs_a_bounded_number_of_lines(unstarted: BrokerProcess, seed: int) -> None:
    """10,000 bad frames from 4 raw ZeroMQ peers (garbage, wrong protocol version, unknown operations, bad
    arguments) plus oversized messages, while a good client keeps being served; the broker's stderr grows by a
    few lines per peer, not one per frame."""
    rng = random.Random(seed)
    unstarted.extra_args = ["--max-message-bytes", str(2**20), "--arena-bytes", "0"]
    unstarted.start()
    good_errors: list[BaseException] = []
    served = [0]
    stop = threading.Event()

    def good_client() -> None:
        try:
            with SyncQueue("good", broker=unstarted.address, durability="process") as q:
                while not stop.is_set():
                    q.put({"id": served[0]})
                    served[0] += 1
                    assert q.get(limit=1, offset=served[0] - 1) == [{"id": served[0] - 1}]
        except BaseException as exc:
            good_errors.append(exc)

    thread = threading.Thread(target=good_client)
    thread.start()
    v = PROTOCOL_VERSION
    makers = [
        lambda i: [rng.randbytes(rng.randrange(1, 64))],
        lambda i: [msgpack.packb({"v": v + 7, "id": i, "op": "hello", "args": {}})],
        lambda i: [msgpack.packb({"v": v, "id": i, "op": "drop_tables", "args": {}})],
        lambda i: [
            msgpack.packb({"v": v, "id": i, "op": "read", "args": {"topic": "f", "config": {"num_buckets": "x"}}})
        ],
    ]
    ctx = zmq.Context()
    peers = []
    try:
        for _ in makers:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(unstarted.address)
            peers.append(s)
        t0 = time.monotonic()
        for i in range(10_000):
            k = i % len(makers)
            peers[k].send_multipart(makers[k](i))
            while peers[k].poll(0):
                peers[k].recv_multipart()  # error replies: drained so the broker's queue to us stays short
        oversized = ctx.socket(zmq.DEALER)
        oversized.setsockopt(zmq.LINGER, 0)
        oversized.connect(unstarted.address)
        for _ in range(5):
            oversized.send(b"\0" * (2 * 2**20))  # ZeroMQ drops these and closes the connection
        oversized.close()
        # every bad frame was seen (the broker counts them), and the good client was served meanwhile
        deadline = time.monotonic() + 60
        while True:
            state = json.loads(_status(unstarted.address, "--json").stdout)
            if sum(state["bad_frames"].values()) >= 10_000 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        print(f"10,000 bad frames sent and counted in {time.monotonic() - t0:.1f} s; good client: {served[0]} puts")
    finally:
        stop.set()
        thread.join(60)
        for s in peers:
            s.close()
        ctx.term()
    assert not good_errors, good_errors
    assert served[0] > 0
    assert state["bad_frames"] == {"malformed": 2500, "version": 2500, "bad_request": 5000}
    assert unstarted.proc is not None and unstarted.proc.poll() is None
    assert unstarted.stop() == 0
    lines = unstarted.stderr.splitlines()
    print("\n".join(lines))
    bad = [line for line in lines if "bad frames" in line or "malformed" in line or "bad request" in line]
    bad += [line for line in lines if "protocol version" in line and line not in bad]
    # per peer: its first complaint at once, then one summary line per 10 s interval (the run takes well under
    # a minute: at most a handful of intervals)
    assert 4 <= len(bad) <= 4 * 8, bad
    assert len(lines) < 60
    assert any(re.search(r"\d+ bad frames from peer \w+ in the last \d+ s", line) for line in lines)
