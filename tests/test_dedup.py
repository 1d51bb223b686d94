"""Content dedup (tensors/dedup.py): identical values of a put, and of later puts into the same partition, are
stored once (arena, log, Lance) and every sample reads its exact bytes back as a view of the one copy, embedded
and through a real broker; the broker's status counts what dedup saved."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from persisting import SyncQueue
from persisting.tensors import dedup
from persisting.tensors.column import Column

from .broker_fixture import BrokerProcess, in_arena_mapping

ARENA_BYTES = 16 * 1024 * 1024
PROMPTS, RESPONSES = 4, 4
pytestmark = pytest.mark.slow


def _step(seed: int) -> dict[str, Any]:
    """A GRPO step in small: each prompt's image repeated for its responses, token ids per response."""
    rng = np.random.default_rng(seed)
    images = torch.from_numpy(rng.random((PROMPTS, 3, 32, 32), dtype=np.float32))
    return {
        "pixel_values": images.repeat_interleave(RESPONSES, dim=0),
        "input_ids": torch.from_numpy(rng.integers(0, 1000, (PROMPTS * RESPONSES, 16))),
    }


def _check(data: dict[str, Any], step: dict[str, Any]) -> None:
    values = data["pixel_values"]
    assert isinstance(values, list) and len(values) == PROMPTS * RESPONSES
    for got, want in zip(values, step["pixel_values"], strict=True):
        assert torch.equal(got, want)
    assert torch.equal(data["input_ids"], step["input_ids"])


def test_a_grpo_group_stores_each_image_once_and_every_response_reads_its_exact_image(
    arena_queue_kw: dict[str, Any], seed: int
) -> None:
    step = _step(seed)
    image_bytes = step["pixel_values"][0].numel() * 4
    with SyncQueue("grpo", **arena_queue_kw, dedup=["pixel_values"], num_buckets=1) as q:
        q.put(step, partition_id="step-0")
        moved = q.stats()["zerocopy"]
        assert moved["dedup_put_bytes"] == PROMPTS * RESPONSES * image_bytes
        assert moved["dedup_stored_bytes"] == PROMPTS * image_bytes
        for task in ("reward", "reference", "train"):
            data, meta = q.get_batch(["pixel_values", "input_ids"], PROMPTS * RESPONSES, task, "step-0")
            assert meta.size == PROMPTS * RESPONSES
            _check(data, step)
            if "broker" in arena_queue_kw:
                values = data["pixel_values"]
                assert all(in_arena_mapping(v.data_ptr()) for v in values), "views of the arena, not copies"
                # every response of a prompt views the one copy of its image
                assert len({v.data_ptr() for v in values}) == PROMPTS
            data["pixel_values"][0].add_(1.0)  # a consumer's write stays its own: the next task reads the original
        # a later put of the same images into the partition stores nothing new
        q.put({"pixel_values": step["pixel_values"][::RESPONSES].clone()}, partition_id="step-0")
        assert q.stats()["zerocopy"]["dedup_stored_bytes"] == PROMPTS * image_bytes
        meta = q.get_meta(batch_size=PROMPTS * (RESPONSES + 1), task_name="late", partition_id="step-0")
        late = q.get_data(meta)["pixel_values"]
        assert torch.equal(torch.stack(late[-PROMPTS:]), step["pixel_values"][::RESPONSES])
        assert late[-1].data_ptr() == late[-PROMPTS - 1].data_ptr()  # the 2nd put's samples view the 1st's copy


def test_object_values_are_deduped_and_come_back_exactly(arena_queue_kw: dict[str, Any]) -> None:
    mm = [{"pixel_values": torch.full((64, 64), float(i // 3)), "grid": [1, 2, i // 3]} for i in range(6)]
    with SyncQueue("mm", **arena_queue_kw, dedup=True, objects="pickle") as q:
        q.put({"multi_modal_inputs": mm, "ids": torch.arange(6)}, partition_id="p")
        moved = q.stats()["zerocopy"]
        assert moved["dedup_stored_bytes"] * 3 == moved["dedup_put_bytes"]  # 2 distinct values of 6
        data, _ = q.get_batch(["multi_modal_inputs", "ids"], 6, "t", "p")
    for got, want in zip(data["multi_modal_inputs"], mm, strict=True):
        assert torch.equal(got["pixel_values"], want["pixel_values"]) and got["grid"] == want["grid"]


def test_lance_holds_each_distinct_value_once_and_rows_hold_references(tmp_path: Path, seed: int) -> None:
    lance = pytest.importorskip("lance")
    step = _step(seed)
    with SyncQueue("disk", str(tmp_path), dedup=True, num_buckets=1) as q:
        q.put(step, partition_id="p")
        q.flush()
    ds = lance.dataset(str(tmp_path / "disk" / "bucket-0.lance"))
    where = "_persisting_partition = '{}'"
    payloads = ds.to_table(filter=where.format(dedup.payload_partition("p")))
    samples = ds.to_table(filter=where.format("p")).sort_by("_persisting_index").to_pylist()
    assert payloads.num_rows == PROMPTS and len(samples) == PROMPTS * RESPONSES
    images = payloads.column("pixel_values").combine_chunks().to_numpy_ndarray()  # a typed tensor column
    by_index = dict(zip(payloads.column("_persisting_index").to_pylist(), images, strict=True))
    for r, want in zip(samples, step["pixel_values"].numpy(), strict=True):
        np.testing.assert_array_equal(by_index[r["pixel_values%40payload"]], want)


def test_equal_hashes_of_different_bytes_stay_two_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "digest", lambda _sample: b"same")  # every sample collides
    col = Column("ndarray", "<f4", np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0]], dtype=np.float32))
    d = dedup.distinct_column(col, verify=True)
    assert d.first == [0, 2] and d.inverse == [0, 0, 1, 1]
    assert dedup.distinct_column(col, verify=False).first == [0]  # the hash alone decides by default


def test_a_field_named_like_a_reference_is_refused(tmp_path: Path) -> None:
    with SyncQueue("bad", str(tmp_path)) as q, pytest.raises(Exception, match="@payload"):
        q.put({"x@payload": np.zeros((2, 2))}, partition_id="p")


def test_status_shows_bytes_put_and_stored(arena_broker: BrokerProcess, seed: int) -> None:
    step = _step(seed)
    with SyncQueue("st", broker=arena_broker.address, dedup=True) as q:
        q.put(step, partition_id="p")
    out = subprocess.run(
        [sys.executable, "-m", "broker", "status", "--json", "--socket", arena_broker.address],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    topic = next(t for t in json.loads(out.stdout)["topics"] if t["name"] == "st")
    image_bytes = step["pixel_values"][0].numel() * 4
    assert topic["dedup"]["put_bytes"] == PROMPTS * RESPONSES * image_bytes
    assert topic["dedup"]["stored_bytes"] == PROMPTS * image_bytes


def test_broker_killed_during_deduped_puts_keeps_each_acknowledged_put_once_with_its_bytes(
    tmp_path: Path, seed: int
) -> None:
    from persisting.tensors.arena import default_path

    from . import dedup_worker
    from .broker_fixture import make_broker

    rnd = random.Random(seed)
    broker = make_broker(tmp_path)
    broker.extra_args = ["--arena-bytes", str(ARENA_BYTES)]
    acked: list[int] = []
    try:
        for round_ in range(3):
            broker.start()
            worker = Path(dedup_worker.__file__)
            cmd = [sys.executable, str(worker), broker.address, "crash", f"{round_ * 10_000}:400"]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
            assert proc.stdout is not None
            # the kill comes after the first acknowledgement: under load the worker's start (imports, the arena
            # mapping) can outlast a fixed sleep, and a round with nothing acknowledged checks nothing
            first = proc.stdout.readline()
            time.sleep(rnd.uniform(0.0, 2.0))
            broker.kill()
            proc.kill()  # what it printed before is what was acknowledged
            out, _ = proc.communicate(timeout=60)
            lines = (first + out).decode().splitlines()
            acked += [int(w[1]) for w in (ln.split() for ln in lines) if w[:1] == ["ACK"]]
        broker.start()
        with SyncQueue("crash", broker=broker.address) as q:
            meta = q.get_meta(batch_size=10**6, task_name="check", partition_id="p")
            data = q.get_data(meta)
            toks = [int(t[0]) for t in data["tok"]]
            assert len(toks) == len(set(toks)), "a put stored twice"
            at = dict(zip(toks, range(len(toks)), strict=True))
            for b in acked:  # every acknowledged put is there with each sample's exact bytes
                want = dedup_worker.batch(b)
                for j in range(6):
                    k = at[b * 6 + j]
                    np.testing.assert_array_equal(np.asarray(data["img"][k]), want["img"][j], err_msg=f"batch {b}")
            data.release()
            del data
            stats = q.stats()
        assert stats["zerocopy"]["get_copied_bytes"] >= 0
        arena = json.loads(
            subprocess.run(
                [sys.executable, "-m", "broker", "status", "--json", "--socket", broker.address],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
        )["arena"]
        assert arena["holds"] == 0 and arena["leased_bytes"] == 0, "arena space returned"
        assert broker.stop() == 0
        assert not default_path(broker.storage).exists(), "no shared-memory file left"
    finally:
        broker.ensure_dead()
    print(f"acknowledged puts: {len(acked)} (seed {seed})")
    assert acked


def test_a_retried_put_stores_its_payloads_and_samples_once(arena_queue_kw: dict[str, Any], seed: int) -> None:
    step = _step(seed)
    with SyncQueue("retry", **arena_queue_kw, dedup=True) as q:
        first = q.put(step, partition_id="p", idempotency_key="step-0")
    with SyncQueue("retry", **arena_queue_kw, dedup=True) as q:  # a new producer: its content index is empty
        again = q.put(step, partition_id="p", idempotency_key="step-0")
        assert again.global_indexes == first.global_indexes
        parts = q.partitions()
        assert parts["p"]["samples"] == PROMPTS * RESPONSES
        assert parts[dedup.payload_partition("p")]["samples"] == PROMPTS


def test_metrics_show_bytes_put_and_stored(tmp_path: Path, seed: int) -> None:
    import socket
    import urllib.request

    from .broker_fixture import make_broker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    broker = make_broker(tmp_path)
    broker.extra_args = ["--metrics", str(port), "--arena-bytes", str(ARENA_BYTES)]
    step = _step(seed)
    try:
        broker.start()
        with SyncQueue("m", broker=broker.address, dedup=["pixel_values"]) as q:
            q.put(step, partition_id="p")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        series = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        image_bytes = step["pixel_values"][0].numel() * 4
        assert float(series['persisting_dedup_put_bytes{topic="m"}']) == PROMPTS * RESPONSES * image_bytes
        assert float(series['persisting_dedup_stored_bytes{topic="m"}']) == PROMPTS * image_bytes
        assert broker.stop() == 0
    finally:
        broker.ensure_dead()


def test_a_consumer_gets_views_of_payloads_that_fill_much_of_the_arena(arena_broker: BrokerProcess) -> None:
    """The payload put leases no extent of its own size ahead: the samples' put after it would lie in that
    (large) extent, and a consumer's views of both would pin more than one process may, answered with copies."""
    images = torch.rand(2, 1, 640, 1024)  # 2.5 MiB each: 5 MiB of payloads in a 16 MiB arena (8 MiB per process)
    step = {"pixel_values": images.repeat_interleave(4, dim=0), "input_ids": torch.arange(8 * 16).reshape(8, 16)}
    with SyncQueue("big", broker=arena_broker.address, dedup=["pixel_values"]) as q:
        q.put(step, partition_id="p")
        data, meta = q.get_batch(["pixel_values", "input_ids"], 8, "t", "p")
        assert meta.size == 8 and q.stats()["zerocopy"]["get_copied_bytes"] == 0, "views, not copies"
        assert all(in_arena_mapping(v.data_ptr()) for v in data["pixel_values"])
        for got, want in zip(data["pixel_values"], step["pixel_values"], strict=True):
            assert torch.equal(got, want)
