"""The lifetime of deduped values (engine/payloads.py): a payload row goes when the last live sample referencing it
is cleared (whole partition, some samples, keys), and stays while one does; a put whose value was cleared
meanwhile stores it again; all of it embedded and through a real broker, and with the broker killed at random
moments. Counts come from the Lance datasets themselves (plain lance/pyarrow)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from persisting import Queue, SyncQueue
from persisting.engine import partitions
from persisting.tensors import dedup

from .broker_fixture import BrokerProcess, make_broker, running_broker

ARENA_BYTES = 16 * 1024 * 1024
PROMPTS, RESPONSES = 3, 4
PURGE_SPACING = "0.05"  # seconds between purges of a running topic here (30 by default)
pytestmark = pytest.mark.slow


def image(i: int) -> np.ndarray:
    return np.random.default_rng(i).random((3, 32, 32), dtype=np.float32)  # 12 KiB: deduped


def grpo(image_ids: list[int], tok0: int) -> dict[str, torch.Tensor]:
    """A step: each prompt's image repeated for its responses, token ids tok0.. one per response."""
    images = torch.from_numpy(np.stack([image(i) for i in image_ids]))
    n = len(image_ids) * RESPONSES
    return {
        "pixel_values": images.repeat_interleave(RESPONSES, dim=0),
        "tok": torch.arange(tok0, tok0 + n, dtype=torch.int64).reshape(n, 1),
    }


def lance_rows(topic_dir: Path, partition: str, columns: list[str]) -> list[dict[str, Any]]:
    """Rows of ``partition`` in every bucket's Lance dataset, read with plain lance."""
    import lance

    out: list[dict[str, Any]] = []
    for uri in sorted(topic_dir.glob("bucket-*.lance")):
        table = lance.dataset(str(uri)).to_table(columns=columns, filter=f"_persisting_partition = '{partition}'")
        out += table.to_pylist()
    return out


def payload_rows(topic_dir: Path, partition: str) -> int:
    return len(lance_rows(topic_dir, dedup.payload_partition(partition), ["_persisting_index"]))


def eventually(check: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    """Wait for the background purge (every PURGE_SPACING seconds here) to make ``check`` true."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"still not so after {seconds} s: {what}"
        time.sleep(0.05)


@pytest.fixture(params=["embedded", "broker"])
def queue_kw(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Queue arguments, and the topic directories' parent (to read Lance from)."""
    monkeypatch.setattr(partitions, "PURGE_SPACING_SECONDS", float(PURGE_SPACING))
    monkeypatch.setenv("PERSISTING_PURGE_SPACING", PURGE_SPACING)  # read by the broker subprocess at start
    if request.param == "embedded":
        yield {"storage_path": str(tmp_path / "store")}, tmp_path / "store"
        return
    with running_broker(tmp_path, ["--arena-bytes", str(ARENA_BYTES)]) as broker:
        yield {"broker": broker.address}, broker.storage


def _read_back(q: SyncQueue, task: str, partition: str, want: dict[int, tuple[int, int]]) -> None:
    """Every live sample of ``partition`` reads its exact image and token: ``want`` tok -> (image id, tok)."""
    meta = q.get_meta(["pixel_values", "tok"], 10**6, task, partition)
    assert meta.size == len(want)
    if not want:
        return
    data = q.get_data(meta)
    for tok, got in zip(data["tok"][:, 0].tolist(), data["pixel_values"], strict=True):
        np.testing.assert_array_equal(np.asarray(got), image(want[tok][0]), err_msg=f"sample of token {tok}")
    data.release()


def test_payload_rows_stay_bounded_over_steps_of_put_and_clear(queue_kw: Any) -> None:
    """GRPO steps into one long-lived partition, each cleared after it is read (the whole partition, its samples
    by index, or their keys as verl's kv_clear): the payload rows in Lance drop back to none after every step.
    Image 0 comes back every step, after its row was cleared: it is stored again and reads back exact."""
    kw, root = queue_kw
    steps = 6
    with SyncQueue("steps", **kw, dedup=["pixel_values"], num_buckets=2) as q:
        for s in range(steps):
            ids = [0] + [100 * (s + 1) + k for k in range(1, PROMPTS)]
            step = grpo(ids, 1000 * s)
            n = PROMPTS * RESPONSES
            keys = [f"s{s}-{j}" for j in range(n)]
            if s % 3 == 2:  # keyed samples, their fields written by a deduped put (references in patch rows)
                meta = q.put(
                    step, partition_id="train", batch_meta=q.kv_put(keys, None, "train", tags=[{"step": s}] * n)
                )
            else:
                meta = q.put(step, partition_id="train")
            assert q.partitions()[dedup.payload_partition("train")]["samples"] == PROMPTS
            _read_back(q, f"read-{s}", "train", {1000 * s + j: (ids[j // RESPONSES], 0) for j in range(n)})
            if s % 3 == 0:
                assert q.clear(partition_id="train") == n
            elif s % 3 == 1:
                assert q.clear(meta, partition_id="train") == n
            else:
                assert q.kv_clear(keys, "train") == n
            assert q.partitions()[dedup.payload_partition("train")]["samples"] == 0, f"step {s}: payloads live"
            q.flush()
            eventually(lambda: payload_rows(root / "steps", "train") == 0, f"step {s}: payload rows in Lance")
        stored = q.stats()["zerocopy"]["dedup_stored_bytes"]
        assert stored == steps * PROMPTS * image(0).nbytes, "image 0 stored again each step, after its clear"


def test_partial_clears_keep_the_payloads_live_samples_reference(queue_kw: Any, seed: int) -> None:
    """Puts whose images repeat within and across puts, then samples cleared a few at a time in random order:
    after each clear every remaining sample reads its exact bytes, and exactly the images some remaining sample
    shows are live payload rows (in Lance, once purged)."""
    kw, root = queue_kw
    rng = random.Random(seed)
    want: dict[int, tuple[int, int]] = {}  # tok -> (image id, global index)
    with SyncQueue("partial", **kw, dedup=["pixel_values"], num_buckets=2) as q:
        for p in range(3):
            ids = [rng.randrange(5) for _ in range(PROMPTS)]  # repeats across puts: the content index refers
            meta = q.put(grpo(ids, 100 * p), partition_id="p")
            for j, i in enumerate(meta.global_indexes):
                want[100 * p + j] = (ids[j // RESPONSES], i)
        while want:
            chosen = rng.sample(sorted(want), min(len(want), rng.randint(1, 5)))
            assert q.clear([want[t][1] for t in chosen], partition_id="p") == len(chosen)
            for t in chosen:
                del want[t]
            _read_back(q, f"after-{len(want)}", "p", want)
            shown = len({img for img, _ in want.values()})
            assert q.partitions()[dedup.payload_partition("p")]["samples"] == shown
            q.flush()
            eventually(lambda n=shown: payload_rows(root / "partial", "p") == n, f"{shown} payload rows in Lance")


def test_a_value_put_again_after_its_payload_was_cleared_is_stored_again(queue_kw: Any) -> None:
    """A producer's content index still names the cleared row: the engine refuses the samples' put, and the
    producer stores the value again (also when another Queue did the clear); it reads back exact."""
    kw, _root = queue_kw
    with SyncQueue("again", **kw, dedup=["pixel_values"]) as q:
        first = q.put(grpo([7, 8, 9], 0), partition_id="p")
        other = SyncQueue("again", **kw) if "broker" in kw else q  # embedded: one engine per process anyway
        assert other.clear(first, partition_id="p") == PROMPTS * RESPONSES
        stored = q.stats()["zerocopy"]["dedup_stored_bytes"]
        q.put(grpo([7, 9, 10], 100), partition_id="p", idempotency_key="again-1")
        assert q.stats()["zerocopy"]["dedup_stored_bytes"] == stored + PROMPTS * image(0).nbytes
        _read_back(q, "t", "p", {100 + j: ([7, 9, 10][j // RESPONSES], 0) for j in range(PROMPTS * RESPONSES)})
        # the same put re-sent (its first answer lost, say) is stored once
        again = q.put(grpo([7, 9, 10], 100), partition_id="p", idempotency_key="again-1")
        assert q.partitions()["p"]["samples"] == PROMPTS * RESPONSES and again.size == PROMPTS * RESPONSES
        if other is not q:
            other.close()


@pytest.mark.parametrize("moment", ["samples", "clear"])
def test_a_process_killed_between_payloads_and_samples_converges_at_open(tmp_path: Path, moment: str) -> None:
    """kill -9 of an embedded producer after a put's new payload rows were stored and before its samples
    ("samples"), or after a clear of samples was logged and before their payload rows' clear ("clear": the
    second record of that log write torn away): the next open clears the payload rows no sample references (they
    leave Lance), and the others still read exact."""
    from . import payload_crash_worker as worker

    out = subprocess.run(
        [sys.executable, worker.__file__, str(tmp_path), moment], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == -signal.SIGKILL and "DONE puts" in out.stdout, out.stderr[-2000:]
    kept = 2 if moment == "clear" else 4  # images of A (and of B, unless B was cleared)
    with SyncQueue("crash", str(tmp_path), dedup=["pixel_values"], num_buckets=1) as q:
        assert q.partitions()[dedup.payload_partition("p")]["samples"] == kept
        meta = q.get_meta(["pixel_values", "tok"], 100, "t", "p")
        data = q.get_data(meta)
        images = [1, 1, 2, 2] + ([] if moment == "clear" else [3, 3, 4, 4])
        assert meta.size == len(images)
        for got, i in zip(data["pixel_values"], images, strict=True):
            np.testing.assert_array_equal(np.asarray(got), image(i))
    assert payload_rows(tmp_path / "crash", "p") == kept  # the orphans were purged (open, then close)


def test_the_payload_partition_itself_cannot_be_cleared(tmp_path: Path) -> None:
    with SyncQueue("own", str(tmp_path), dedup=True) as q:
        q.put(grpo([1], 0), partition_id="p")
        with pytest.raises(Exception, match="cleared with the last sample"):
            q.clear(partition_id=dedup.payload_partition("p"))


def test_broker_killed_during_puts_and_clears_leaves_no_payload_dangling_or_orphaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """A producer puts GRPO steps (images repeating across steps) and clears samples and sometimes the whole
    partition without pause while the broker is killed (SIGKILL) and restarted three times, purging meanwhile.
    Afterwards: every acknowledged sample not cleared reads its exact image; Lance holds exactly one payload row
    per image a live sample references and no reference to anything else; after the partition is cleared and
    purged no payload row is left; no arena space stays leased or held and no shared-memory file is left."""
    from persisting.tensors.arena import default_path

    monkeypatch.setenv("PERSISTING_PURGE_SPACING", PURGE_SPACING)
    rng = random.Random(seed)
    broker = make_broker(tmp_path)
    broker.extra_args = ["--arena-bytes", str(ARENA_BYTES)]
    broker.log_path = tmp_path / "broker.log"  # printed on a failure
    broker.start()
    want: dict[int, int] = {}  # global index -> image id, of acknowledged samples not cleared
    counts = {"puts": 0, "clears": 0, "whole": 0}

    async def producer(done: asyncio.Event) -> None:
        async with Queue("kill", broker=broker.address, dedup=["pixel_values"], durability="process") as q:
            s = 0
            while not done.is_set():
                ids = [rng.randrange(6) for _ in range(PROMPTS)]
                meta = await q.put(grpo(ids, 100 * s), partition_id="p")
                want.update((i, ids[j // RESPONSES]) for j, i in enumerate(meta.global_indexes))
                counts["puts"] += 1
                s += 1
                if rng.random() < 0.1:
                    await q.clear(partition_id="p")
                    want.clear()
                    counts["whole"] += 1
                elif rng.random() < 0.6 and want:
                    chosen = rng.sample(sorted(want), min(len(want), rng.randint(1, 8)))
                    await q.clear(chosen, partition_id="p")
                    for i in chosen:
                        del want[i]
                    counts["clears"] += 1

    async def main() -> None:
        done = asyncio.Event()
        task = asyncio.create_task(producer(done))
        for _ in range(3):
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            await asyncio.to_thread(broker.stop, signal.SIGKILL)
            await asyncio.to_thread(broker.start)
        await asyncio.sleep(0.3)
        done.set()
        await asyncio.wait_for(task, 60)

    try:
        asyncio.run(main())
        print(f"seed {seed}: {counts}, {len(want)} live samples")
        assert counts["puts"] > 3 and counts["clears"], f"seed {seed}: the workload did too little"
        with SyncQueue("kill", broker=broker.address, durability="process") as q:
            meta = q.get_meta(["pixel_values"], 10**6, "check", "p")
            assert sorted(meta.global_indexes) == sorted(want), f"seed {seed}: live samples after the kills"
            if want:
                data = q.get_data(meta)
                for i, got in zip(meta.global_indexes, data["pixel_values"], strict=True):
                    np.testing.assert_array_equal(np.asarray(got), image(want[i]), err_msg=f"seed {seed}: {i}")
                data.release()
                del data
            live_payloads = q.partitions()[dedup.payload_partition("p")]["samples"]
            assert live_payloads == len(set(want.values())), f"seed {seed}: one payload row per image shown"
        assert broker.stop() == 0  # the clean stop flushes and purges
        samples = lance_rows(broker.storage / "kill", "p", ["_persisting_index", "pixel_values%40payload"])
        refs = {r["pixel_values%40payload"] for r in samples}
        stored = {
            r["_persisting_index"]
            for r in lance_rows(broker.storage / "kill", dedup.payload_partition("p"), ["_persisting_index"])
        }
        assert len(samples) == len(want) and refs == stored, f"seed {seed}: Lance holds {stored} for references {refs}"
        broker.start()
        with SyncQueue("kill", broker=broker.address, durability="process") as q:
            q.clear(partition_id="p")
        arena = _broker_status(broker)["arena"]
        assert arena["holds"] == 0 and arena["leased_bytes"] == 0, f"seed {seed}: arena space not returned"
        assert broker.stop() == 0
        assert payload_rows(broker.storage / "kill", "p") == 0, f"seed {seed}: payload rows of a cleared partition"
        assert not lance_rows(broker.storage / "kill", "p", ["_persisting_index"])
        assert not default_path(broker.storage).exists(), "no shared-memory file left"
    except BaseException:
        print(broker.log_path.read_text()[-6000:])
        raise
    finally:
        broker.ensure_dead()


def _broker_status(broker: BrokerProcess) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "broker", "status", "--json", "--socket", broker.address],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ},
    )
    return dict(json.loads(out.stdout))
