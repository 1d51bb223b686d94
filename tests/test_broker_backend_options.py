"""The broker's ``[backend_options]`` TOML table reaches every topic's Lance backend (a client may not send backend
options in broker mode): with ``compact_min_fragments = 2`` a bucket of a few flushed puts is compacted, and a
value that is not a table is refused at start, by name."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import lance

from persisting import SyncQueue
from persisting.engine import topic_dirname

from .broker_fixture import make_broker

ROOT = Path(__file__).resolve().parent.parent


def _fragments(storage: Path, topic: str) -> int:
    return len(lance.dataset(str(storage / topic_dirname(topic) / "bucket-0.lance")).get_fragments())


def test_backend_options_from_the_config_file_reach_the_topics(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[backend_options]\ncompact_min_fragments = 2\n")
    b = make_broker(tmp_path)
    b.extra_args = ["--config", str(config), "--arena-bytes", "0"]
    try:
        b.start()
        with SyncQueue("t", broker=b.address, num_buckets=1) as q:
            for i in range(4):
                q.put_batch([{"id": i}])
                q.flush()  # one fragment each; the flush loop's housekeeping compacts them (16 by default)
            deadline = time.monotonic() + 20
            while _fragments(b.storage, "t") > 1 and time.monotonic() < deadline:
                q.flush()
                time.sleep(0.2)
            assert _fragments(b.storage, "t") == 1, "the bucket was not compacted: the option did not reach it"
        assert b.stop() == 0
        b.start()
        with SyncQueue("t", broker=b.address, num_buckets=1) as q:
            assert [r["id"] for rows in q.stream() for r in rows] == [0, 1, 2, 3]
        assert b.stop() == 0
    finally:
        b.ensure_dead()


def test_backend_options_that_are_not_a_table_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("backend_options = 2\n")
    cmd = [sys.executable, "-m", "broker", "--config", str(config), "--storage-path", str(tmp_path / "s")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "backend_options in" in done.stderr and "must be a table" in done.stderr
