"""persisting.compat.transfer_queue driven by verl 0.9.1's own code, and compared with the real TransferQueue 0.1.11.

``tests/tq_scenarios.py`` (with ``tq_scenarios_verl.py`` and ``tq_shapes.py``) runs verl-shaped scenarios (the KV
semantics verl relies on, BatchMeta/KVBatchMeta, checkpoint and verl's in-flight re-issue, verl's ReplayBuffer in
sync mode, with the DAPO filter, and ReplayBufferAsync, a RayWorkerGroup of 2 CPU workers whose ``@register``ed
method receives a ``KVBatchMeta``) in a subprocess per backend (both are ``transfer_queue``), each printing what it
observed as JSON. The tests check the persisting run against the semantics the issue lists, then compare both runs:
they must agree except for the differences listed in ``INTENDED`` (each with why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_tq_crash import stop_broker

pytest.importorskip("verl")
pytest.importorskip("tensordict")

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ["semantics", "batchmeta", "checkpoint", "replay_sync", "replay_dapo", "replay_async", "worker_group"]

# Where persisting's layer differs from TransferQueue 0.1.11 on purpose (path prefix -> why).
INTENDED = {
    # verl's bridge returns BatchMeta() for ranks that collect nothing; TransferQueue's constructor needs two
    # arguments there (a TypeError in verl's own code path). The layer accepts no argument.
    "/batchmeta/no_arg": "BatchMeta() with no argument works",
    # TransferQueue registers the keys of a kv_batch_put before it checks that tags match them, so a refused put
    # leaves keys "a" and "b" behind with empty tags; the layer checks first and a refused put stores nothing.
    "/semantics/kv_list_all/ok/train/a": "a refused put stores nothing",
    "/semantics/kv_list_all/ok/train/b": "a refused put stores nothing",
    "/semantics/kv_list_after/ok/train/a": "a refused put stores nothing",
    "/semantics/kv_list_after/ok/train/b": "a refused put stores nothing",
}


def start_scenarios(backend: str, workdir: Path) -> subprocess.Popen[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    # verl sorts a set of uids by step, so ties follow string hashing: fix it for both runs
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "tests.tq_scenarios", "--backend", backend, "--workdir", str(workdir), *SCENARIOS]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_scenarios(backend: str, workdir: Path, proc: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    finally:  # the broker runs in its own session: stop it if the run could not (killed, timed out)
        stop_broker(workdir / "run")
    if proc.returncode != 0:
        raise AssertionError(f"{backend} scenarios failed ({proc.returncode}):\n{err[-6000:]}")
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any] | None]:
    """Both backends' runs, started together: each is one process that spends most of its time starting Ray and
    verl's workers, so the two overlap on the machine's cores instead of running one after the other. The
    reference is None where TransferQueue is not installed."""
    import importlib.util

    backends = ["persisting"] + (["transferqueue"] if importlib.util.find_spec("transfer_queue") else [])
    # short paths: the broker's ipc socket lives under them (ipc paths are limited to ~107 bytes)
    workdirs = {b: Path(tmp_path_factory.mktemp(b[0])) for b in backends}
    procs = {b: start_scenarios(b, workdirs[b]) for b in backends}
    try:
        return {b: finish_scenarios(b, workdirs[b], procs[b]) for b in backends} | {
            b: None for b in ("transferqueue",) if b not in backends
        }
    finally:
        for b, proc in procs.items():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            stop_broker(workdirs[b] / "run")


@pytest.fixture(scope="module")
def ours(runs: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    result = runs["persisting"]
    assert result is not None
    return result


@pytest.fixture(scope="module")
def reference(runs: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    if runs["transferqueue"] is None:
        pytest.skip("transfer_queue is not installed")
    return runs["transferqueue"]


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if any(path.startswith(p) for p in INTENDED):
        return []
    if type(a) is not type(b):
        return [f"{path}: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}/{k}"
            if k not in a or k not in b:
                if not any(sub.startswith(p) for p in INTENDED):
                    out.append(f"{sub}: only in {'ours' if k in a else 'TransferQueue'}")
                continue
            out += differences(a[k], b[k], sub)
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}"]
        return [d for n, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{n}]")]
    return [] if a == b else [f"{path}: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}"]


def test_the_same_scenarios_give_the_same_results_as_transferqueue(ours: dict, reference: dict) -> None:
    assert differences(ours, reference) == []


def test_kv_semantics_verl_relies_on(ours: dict) -> None:
    s = ours["semantics"]
    assert s["tag_only"]["ok"]["tags"] == [{"status": "pending", "n": 1}] and s["tag_only"]["ok"]["fields"] == []
    assert s["tags_merged"]["ok"]["tags"] == [{"status": "running", "n": 1}]  # dict.update, not replace
    put = s["batch_put"]
    assert put["extra_info"] == {"mine": 1}  # mutable extra_info
    assert "responses" in put["fields"] and put["tags"][0]["status"] == "success"
    assert s["tag_kept"]["ok"]["status"] == "success"  # a put with fields and no tags keeps the tag
    cols = s["partial_write_keeps_columns"]["ok"]["td"]
    assert {"old_log_probs", "responses", "prompts", "rm_scores", "extra_fields"} <= set(cols)
    assert "jagged" in cols["responses"] and cols["responses"]["offsets"][0] == 0
    assert s["common_columns_only"]["ok"] == sorted(set(cols))  # "vpred" written for one key only
    assert set(s["select_dropped"]["ok"]["td"]) == {"rm_scores"}  # "vpred" not on every key: dropped
    assert s["missing_key_left_out"]["ok"]["batch"] == [1]
    assert s["err_no_key"] == {"error": "ValueError", "msg": "keys or partition were not found!"}
    assert s["err_no_shared_column"]["error"] == "ValueError"
    assert s["cleared_get"]["error"] == "ValueError"
    assert s["clear_again"] == {"ok": None}  # idempotent, unknown keys ignored
    assert s["recreated"]["ok"]["tags"] == [{}]  # cleared then created again: empty tag
    assert "train" in s["kv_list_all"]["ok"] and "val" in s["kv_list_after"]["ok"]
    assert s["kv_list_unknown"] == {"ok": {}}
    assert s["cleared_partition_listed"] == {"emptied": {}}  # clear_partition: gone; every key cleared: listed
    dense = s["dense_comes_back_jagged"]["td"]
    assert dense["mm"]["nts"][1]["pixel"]["dense"] == [[0.0, 0.0]]  # tensors inside objects
    assert dense["ids"]["offsets"] == [0, 4, 8] and dense["score"] == {"dense": [0.5, 1.5], "dtype": "torch.float32"}
    assert s["padded"] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # to_padded_tensor pads to the longest sample
    assert cols["extra_fields"]["nts"][0]["reward_extra_info"] == {"acc": 0.0}  # dicts come back as dicts
    assert s["retrieve_meta"]["size"] == 2 and s["retrieve_keys"] == ["d1", "d0"]


def test_batchmeta_and_kvbatchmeta(ours: dict) -> None:
    b = ours["batchmeta"]
    assert b["no_arg"] == {"ok": [0, [], False]}
    assert b["kv_is_dataclass"] and b["chunk_sizes"] == [2, 1]
    assert [c["keys"] for c in b["kv_chunk"]] == [["a", "b"], ["c"]]
    assert b["concat"][0] == 3 and b["concat"][2] == {"step": 3} and b["concat"][3]
    assert b["pickle"][2] is True and b["get_after_pickle"]["td"]["responses"]["offsets"][0] == 0


def test_checkpoint_and_verls_reissue(ours: dict) -> None:
    c = ours["checkpoint"]
    assert c["metadata_json"] == {"storage_saved": True, "user_metadata": {"global_steps": 2}}
    assert c["no_tmp_left"] == ["transfer_queue"]
    assert c["metadata_again"]["user_metadata"]["again"] is True
    restored = c["restored_list"]["train"]
    assert "late" not in restored and "c1" in restored and "c1_0_0" in restored  # keys since the save: gone
    assert "ok" in c["restored_data"]
    assert c["err_missing_dir"] == "FileNotFoundError"
    assert c["reissued"] == 1 and c["after_reissue"]["train"]["c3"]["status"] == "pending"


def test_verls_replay_buffers(ours: dict) -> None:
    sync = ours["replay_sync"]
    assert len(sync["batch"]["keys"]) == 4 and sync["metrics"] == {}
    assert set(sync["step"]["out"]["td"]) == {"old_log_probs", "values", "rm_scores"}
    dapo = ours["replay_dapo"]
    assert dapo["refills"] == [2]  # g1 (no reward signal) evicted, 2 prompts refilled (sync DAPO: 2k)
    assert dapo["metrics"]["training/filter_groups/evicted_samples"] == 1
    assert not any(k.startswith("g1") for k in dapo["left"]["train"])
    assert len({k.split("_")[0] for k in dapo["batch"]["keys"]}) == 3
    asynchronous = ours["replay_async"]
    assert asynchronous["refills"] == [2]  # o1 stale (threshold 2) and o4 failed: evicted, 2 refilled
    assert {k.split("_")[0] for k in asynchronous["batch"]["keys"]} == {"o2", "o3"}


def test_verls_worker_group_receives_a_kvbatchmeta(ours: dict) -> None:
    w = ours["worker_group"]
    assert w["out"]["keys"] == ["w1_0_0", "w1_1_0", "w2_0_0", "w2_1_0"]
    assert {"old_log_probs", "rank"} <= set(w["out"]["fields"])
    assert w["got"]["td"]["rank"]["dense"] == [0, 0, 1, 1]  # each of the 2 workers wrote its half
