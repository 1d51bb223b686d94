"""persisting.compat.transfer_queue: the data plane's lifetime, activation, the names verl imports, and the sampler
interface TransferQueue and persisting share (in persisting itself too)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from persisting import BatchMeta, GRPOGroupNSampler, PickSampler, SampleMeta, SequentialSampler, SyncQueue
from persisting.compat.transfer_queue import activate

ROOT = Path(__file__).resolve().parent.parent


class NewestFirst:
    """A sampler written for TransferQueue's interface (argument named ready_indexes, extra keywords ignored)."""

    def sample(self, ready_indexes: list[int], batch_size: int, *args: object, **kwargs: object):
        picked = list(reversed(ready_indexes))[:batch_size]
        return picked, picked


def test_a_transferqueue_sampler_works_unchanged_in_persisting(tmp_path: Path) -> None:
    with SyncQueue("s", storage_path=str(tmp_path)) as q:
        q.put({"x": [1, 2, 3, 4]}, partition_id="p")
        meta = q.get_meta(["x"], 2, "task", "p", sampler=NewestFirst())
        assert meta.global_indexes == [3, 2]


@pytest.mark.parametrize("sampler", [SequentialSampler(), GRPOGroupNSampler(2), PickSampler()])
def test_built_in_samplers_take_ready_indexes_by_name(sampler: object) -> None:
    by_name = sampler.sample(ready_indexes=[4, 5, 6, 7], batch_size=2)  # type: ignore[attr-defined]
    assert by_name[:2] == sampler.sample([4, 5, 6, 7], 2)[:2]  # type: ignore[attr-defined]
    assert sampler.sample(ready=[4, 5, 6, 7], batch_size=2)[:2] == by_name[:2]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="twice"):
        sampler.sample([1], 1, ready_indexes=[1])  # type: ignore[attr-defined]


def test_check_ready_of_a_meta_naming_no_field_describes_every_field(tmp_path: Path) -> None:
    with SyncQueue("d", storage_path=str(tmp_path)) as q:
        put = q.put({"a": [1, 2], "b": ["x", "y"]}, partition_id="p")
        q.put({"c": [0.5]}, partition_id="p", batch_meta=put.select_samples([1]))
        bare = BatchMeta(tuple(SampleMeta(i, "p") for i in put.global_indexes))
        described = q.check_ready(bare)
        assert [sorted(s.fields) for s in described.samples] == [["a", "b"], ["a", "b", "c"]]


def test_every_name_verl_uses_exists() -> None:
    pytest.importorskip("verl")
    import importlib.util

    import persisting.compat.transfer_queue as layer

    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    names: set[str] = set()
    for path in Path(next(iter(spec.submodule_search_locations))).rglob("*.py"):
        text = path.read_text(errors="replace")
        if "transfer_queue" not in text:
            continue
        names.update(re.findall(r"\btq\.([A-Za-z_]\w*)\(", text))
        blocks = re.findall(r"from transfer_queue import \(([^)]*)\)", text)
        blocks += re.findall(r"^\s*from transfer_queue import ([\w ,]+)$", text, re.MULTILINE)
        for block in blocks:
            names.update(n.strip() for n in block.split(",") if n.strip())
    assert {"KVBatchMeta", "BatchMeta", "init", "kv_batch_put", "async_kv_put"} <= names
    assert sorted(n for n in names if not hasattr(layer, n)) == []


def test_the_shim_makes_import_transfer_queue_the_layer(tmp_path: Path) -> None:
    activate.write_shim(tmp_path)
    code = (
        "import transfer_queue as tq\n"
        "from transfer_queue import BatchMeta, KVBatchMeta\n"
        "from transfer_queue.metadata import BatchMeta as B2\n"
        "assert B2 is BatchMeta and tq.BACKEND == 'persisting', tq\n"
        "print(tq.__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "persisting.compat.transfer_queue"
    if activate.real_transfer_queue() is not None:  # never a silent shadow: the warning names both and the fix
        assert "TransferQueue 0.1.11" in proc.stderr and "persisting-transfer-queue disable" in proc.stderr


def test_enable_refuses_to_shadow_a_real_transferqueue(tmp_path: Path) -> None:
    if activate.real_transfer_queue() is None:
        pytest.skip("TransferQueue is not installed here")
    with pytest.raises(SystemExit, match="pip uninstall TransferQueue"):
        activate.enable(tmp_path)
    assert not (tmp_path / "transfer_queue").exists()


def test_enable_disable_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activate, "real_transfer_queue", lambda: None)
    assert activate.status(tmp_path).startswith("not enabled")
    assert "enabled" in activate.enable(tmp_path)
    assert activate.enable(tmp_path)  # again: rewrites its own shim
    assert activate.status(tmp_path).startswith("enabled")
    assert "removed" in activate.disable(tmp_path)
    assert not (tmp_path / "transfer_queue").exists()
    foreign = tmp_path / "transfer_queue"
    foreign.mkdir()
    (foreign / "__init__.py").write_text("# someone else's\n")
    with pytest.raises(SystemExit, match="not persisting's shim"):
        activate.enable(tmp_path)
    with pytest.raises(SystemExit, match="not persisting's shim"):
        activate.disable(tmp_path)
    assert (foreign / "__init__.py").exists()


ATTACH = """
import sys
import persisting.compat.transfer_queue as tq
tq.init({"persisting": {"storage_path": "ignored: it attaches"}})
assert not tq.interface._plane.owner
tq.kv_put(key=sys.argv[1], partition_id="train", tag={"from": "attached"})
print(sorted(tq.kv_list("train")["train"]))
tq.close()
"""


def test_init_starts_once_attaches_after_and_only_the_owner_stops_the_broker(tmp_path: Path) -> None:
    pytest.importorskip("tensordict")
    import persisting.compat.transfer_queue as tq
    from persisting.compat.transfer_queue import node_broker

    run_dir = Path(tempfile.mkdtemp(prefix="tql-"))
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(run_dir)
    try:
        tq.init({"persisting": {"storage_path": str(tmp_path / "data"), "arena_bytes": 16 << 20}})
        owner = tq.interface._plane
        assert owner is not None and owner.owner and owner.proc is not None
        tq.kv_put(key="k0", partition_id="train", tag={"from": "owner"})
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for key in ("k1", "k2"):  # two processes attach and close in turn: the data plane stays up
            proc = subprocess.run([sys.executable, "-c", ATTACH, key], env=env, capture_output=True, text=True,
                                  timeout=120)  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == "['k0', 'k1', 'k2']"
        assert owner.proc.poll() is None
        assert tq.kv_list("train")["train"] == {"k0": {"from": "owner"}, "k1": {"from": "attached"},
                                                 "k2": {"from": "attached"}}  # fmt: skip
        pid = owner.proc.pid
        tq.close()
        assert owner.proc.poll() == 0 and not Path(f"/proc/{pid}/cmdline").exists()
        assert not node_broker.discovery_file().exists()
    finally:
        tq.close()
        if old is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old


def test_persisting_broker_names_the_data_plane(tmp_path: Path) -> None:
    pytest.importorskip("tensordict")
    from tests.broker_fixture import make_broker

    broker = make_broker(tmp_path)
    broker.start()
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PERSISTING_BROKER": broker.address,
               "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="tqb-")}  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", ATTACH, "b1"], env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == "['b1']"
        assert broker.proc is not None and broker.proc.poll() is None  # not stopped by a process that attached
        assert broker.stop() == 0
    finally:
        broker.ensure_dead()
