"""Dedup in the TransferQueue layer (``persisting.dedup``): a verl multimodal GRPO step stores each prompt's image
once, and everything verl reads back is what it reads without dedup.

A rollout process ``kv_batch_put``s 8 prompts x 4 responses (each response's ``multi_modal_inputs`` a dict with
its prompt's ~1 MiB ``pixel_values``, a dense per-prompt image column, a dense distinct column, jagged
prompts/responses), another process reads them back (``kv_batch_get``, a partial column write, tags, a clear, a
checkpoint saved and loaded). Run with dedup on ("auto", the default) and off, on brokers of their own: the
reads are identical (a digest of every value, layout, offset and dtype), the deduped run stores a quarter of the
repeated bytes (the broker's dedup counters, exact) and of the data on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tensordict")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _worker(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PERSISTING_LOG_LEVEL": "WARNING"}
    proc = subprocess.run([sys.executable, "-m", "tests.tq_dedup_worker", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run(tmp_path: Path, dedup: Any, seed: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int]:
    """One step through a broker of its own: (what the rollout saw, what the reader saw, the broker's dedup
    counters, bytes on disk after the broker stopped)."""
    import persisting.compat.transfer_queue as tq

    run_dir = Path(tempfile.mkdtemp(prefix="tqd-"))  # short: the broker's ipc socket lives there
    storage = tmp_path / f"data-{dedup}"
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(run_dir)
    try:
        section: dict[str, Any] = {"storage_path": str(storage), "arena_bytes": 128 << 20}
        if dedup is not None:
            section["dedup"] = dedup
        tq.init({"persisting": section})
        plane = tq.interface._plane
        assert plane is not None
        address = plane.address
        put = _worker(["rollout", str(seed)])
        got = _worker(["read", str(seed), str(tmp_path / f"ckpt-{dedup}")])
        status = subprocess.run([sys.executable, "-m", "broker", "status", "--json", "--socket", address],
                                capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
        topic = next(t for t in json.loads(status.stdout)["topics"] if t["name"] == "transfer_queue")
        counters = dict(topic.get("dedup") or {})
    finally:
        tq.close()  # the owner: stops the broker (what it holds is flushed)
        shutil.rmtree(run_dir, ignore_errors=True)
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old
    return put, got, counters, _bytes_under(storage)


def test_a_multimodal_grpo_step_stores_each_image_once_and_reads_back_as_without_dedup(
    tmp_path: Path, seed: int
) -> None:
    from .tq_dedup_worker import PIXELS, PROMPTS, RESPONSES

    off_put, off, off_counters, off_disk = _run(tmp_path, False, seed)
    on_put, on, on_counters, on_disk = _run(tmp_path, None, seed)  # the default: "auto"
    print(f"seed={seed} disk: off {off_disk} B, auto {on_disk} B; counters {on_counters}")
    fields = ["image", "multi_modal_inputs", "old_values", "prompts", "responses"]
    assert off_put["fields"] == on_put["fields"] == fields  # deduped fields under the names they were put with
    for got in (off, on):
        assert all(got["exact"].values()), got["exact"]
        assert got["restored"], "a checkpoint of the store did not restore it exactly"
        assert got["fields"] == ["advantages", *fields]
    assert on["digest"] == off["digest"], "kv_batch_get with dedup differs from kv_batch_get without"
    assert not off_counters.get("put_bytes")
    # multi_modal_inputs and the image column repeat 4 times; the distinct 8 KiB column stays plain (auto)
    assert on_counters["put_bytes"] == RESPONSES * on_counters["stored_bytes"] > 0
    image_bytes = PIXELS[0] * PIXELS[1] * 4
    assert on_counters["put_bytes"] > PROMPTS * RESPONSES * image_bytes
    assert on_disk < 0.35 * off_disk, f"on disk: {on_disk} B deduped, {off_disk} B not"


def test_the_dedup_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERSISTING_TQ_DEDUP", raising=False)
    from persisting.compat.transfer_queue.config import dedup_mode
    from persisting.errors import ConfigError

    assert dedup_mode({}) == "auto"
    monkeypatch.setenv("PERSISTING_TQ_DEDUP", "multi_modal_inputs,image")
    assert dedup_mode({}) == frozenset({"multi_modal_inputs", "image"})
    assert dedup_mode({"dedup": True}) is True  # the conf wins
    assert dedup_mode({"dedup": "false"}) is False
    assert dedup_mode({"dedup": ["multi_modal_inputs"]}) == frozenset({"multi_modal_inputs"})
    with pytest.raises(ConfigError, match="dedup must be True, False, 'auto' or a list of field names"):
        dedup_mode({"dedup": "yes"})
