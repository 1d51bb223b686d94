"""A process that only talks to a broker loads no storage: no Lance, pyarrow or pandas, no torch unless it passes
a torch tensor, and none of the engine's topic machinery (issue 22: every worker process pays its imports at start).

Each check runs in a fresh interpreter, since this one has loaded everything already. What may load what:
- ``import persisting`` (and the compat layers): none of them.
- a broker-mode ``Queue``: records, tensor batches of numpy arrays, keyed samples, samples taken and read back:
  none of them (the broker owns storage). torch loads where the caller passes or asks for torch tensors.
- an embedded ``Queue``: Lance (with pyarrow and pandas) at its first open, where the backend is chosen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.broker_fixture import running_broker

ROOT = Path(__file__).resolve().parent.parent
STORAGE = ("lance", "pyarrow", "pandas")
# the topic, its log and its reads: loaded by an embedded open or the broker, never by a client of a broker
ENGINE_STORAGE = (
    "persisting.engine.topic",
    "persisting.engine.wal",
    "persisting.engine.reader",
    "persisting.storage",
)
OLD_NAMES = ("persisting.queue",)  # storage's old name: only code that imports it loads it
HEAVY = (*STORAGE, "torch", "prometheus_client", "ray", *ENGINE_STORAGE, *OLD_NAMES)

REPORT = "import json, sys\nprint(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"


def _loaded(code: str, *args: str) -> list[str]:
    """The HEAVY modules loaded once ``code`` has run in a fresh interpreter."""
    script = code + REPORT.format(heavy=HEAVY)
    command = [sys.executable, "-c", script, *args]
    proc = subprocess.run(command, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return loaded


def test_import_persisting_loads_no_storage() -> None:
    assert _loaded("import persisting\n") == []


def test_the_compat_layers_load_no_storage() -> None:
    code = "import persisting.compat.persistqueue\nimport persisting.compat.transfer_queue\nimport persisting.queue\n"
    # the packages themselves (persisting.queue is storage's old name): the Lance backends load on first use
    assert _loaded(code) == ["persisting.queue", "persisting.storage"]


BROKER_CLIENT = """
import sys
import numpy as np
from persisting import Queue, SyncQueue

address = sys.argv[1]
with SyncQueue("records", broker=address) as q:
    q.put({"id": 1, "text": "a"}, idempotency_key="k-1")
    q.put_batch([{"id": 2}, {"id": 3}])
    q.flush()
    assert [r["id"] for r in q.get(10)] == [1, 2, 3], q.get(10)
    assert len(q) == 3

with SyncQueue("samples", broker=address) as q:
    q.put({"obs": np.arange(12, dtype=np.float32).reshape(4, 3), "reward": [0.5, 1.0, 1.5, 2.0]}, partition_id="p")
    meta = q.get_meta(["obs", "reward"], batch_size=4, task_name="train", partition_id="p")
    data = q.get_data(meta)
    assert data["obs"].shape == (4, 3) and float(data["obs"][3, 2]) == 11.0, data
    q.kv_put(["a", "b"], {"x": np.ones((2, 5), dtype=np.int64)}, partition_id="kv", tags=[{"t": 1}, {"t": 2}])
    got, found = q.kv_get(["b", "a", "nope"], partition_id="kv")
    assert found.extra_info["missing"] == ["nope"] and got["x"].shape == (2, 5), (got, found)
    q.kv_clear(["a"], partition_id="kv")
"""


def test_a_broker_client_loads_no_storage(tmp_path: Path) -> None:
    with running_broker(tmp_path, []) as broker:
        assert _loaded(BROKER_CLIENT, broker.address) == []


PERSIST_QUEUE_WORKER = """
import sys
import persisting.compat.persistqueue as persistqueue

address, folder = sys.argv[1], sys.argv[2]
q = persistqueue.SQLiteAckQueue(folder + "/ack.db", broker=address, durability="process")
for i in range(3):
    q.put({"i": i, "text": "x" * i})
got = [q.get(timeout=5.0) for _ in range(3)]
for item in got:
    q.ack(item)
assert [g["i"] for g in got] == [0, 1, 2] and q.acked_count() == 3 and q.qsize() == 0, (got, q.acked_count())
q.close()
plain = persistqueue.SQLiteQueue(folder + "/plain.db", broker=address, durability="process")
plain.put(1)
assert plain.get(timeout=5.0) == 1
plain.close()
"""


def test_a_persist_queue_worker_loads_no_numpy(tmp_path: Path) -> None:
    """A persist-queue worker through a broker (put, get, ack) never touches an array: numpy stays unloaded (a
    third of the worker's import time), and so do storage, torch and the engine's topic."""
    code = PERSIST_QUEUE_WORKER + REPORT.format(heavy=(*HEAVY, "numpy"))
    with running_broker(tmp_path / "broker", []) as broker:
        proc = subprocess.run(
            [sys.executable, "-c", code, broker.address, str(tmp_path)],
            cwd=ROOT,
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


NUMPY_AT_FIRST_USE = """
import sys
from persisting.lazy_numpy import np
from persisting.wire import codec

assert codec.kind_of(1, "f") == "int" and codec.kind_of(b"x", "f") == "bytes"
assert not isinstance(1, np.ndarray | np.generic) and "numpy" not in sys.modules
import numpy

assert np.ndarray is numpy.ndarray and np.float32 is numpy.float32
assert codec.kind_of(numpy.zeros(2), "f") == "ndarray" and codec.kind_of(numpy.float32(1), "f") == "ndarray"
"""


def test_numpy_is_the_real_one_once_loaded() -> None:
    """Before numpy is imported nothing is one of its arrays (and asking imports nothing); after, the lazy name
    is numpy itself and arrays are told apart as before."""
    assert _loaded(NUMPY_AT_FIRST_USE) == []


def test_the_embedded_queue_loads_lance_at_its_first_open(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom persisting import SyncQueue\n"
        "with SyncQueue('t', storage_path=sys.argv[1]) as q:\n"
        "    q.put({'id': 1})\n    q.flush()\n    assert q.get(1) == [{'id': 1}]\n"
    )
    loaded = _loaded(code, str(tmp_path / "data"))
    assert set(STORAGE) | set(ENGINE_STORAGE) <= set(loaded), loaded
    assert "torch" not in loaded


def test_every_name_the_engine_exports_loads() -> None:
    import persisting.engine as engine

    assert sorted(engine._EXPORTS) == sorted(engine.__all__)  # a name added to one and not the other fails here
    for name in engine.__all__:
        assert getattr(engine, name) is not None
    assert "Topic" in dir(engine)
