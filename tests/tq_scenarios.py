"""verl-shaped scenarios run against a ``transfer_queue`` module: persisting's layer or the real TransferQueue 0.1.11.

    python -m tests.tq_scenarios --backend persisting|transferqueue --workdir DIR SCENARIO... > result.json

Each scenario drives TransferQueue's API the way verl 0.9.1 does, or verl's own code (its ``ReplayBuffer`` and
``ReplayBufferAsync``, its trainer's in-flight re-issue after ``load_checkpoint``, a ``RayWorkerGroup`` whose
``@register``ed method receives a ``KVBatchMeta``), and returns what it observed as plain JSON (tensors as lists
with their layout, offsets and dtype; errors as their type and message). The differential test runs both backends
in separate processes (both define ``transfer_queue``) and compares the JSON.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tests.tq_scenarios_verl import VERL_SCENARIOS
from tests.tq_shapes import attempt, canon, trajectories

SCENARIOS: dict[str, Callable[[Any], Any]] = {}
RAY_CPUS = 6  # logical: TransferQueue's controller and storage unit take one each, the worker group two
ARENA_BYTES = 64 << 20
SCENARIO_TIMEOUT_S = 120


def scenario(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


# -- scenarios --------------------------------------------------------------------------------------------
@scenario
def semantics(tq: Any) -> Any:
    from tensordict import NonTensorStack, TensorDict

    r: dict[str, Any] = {}
    r["tag_only"] = attempt(lambda: tq.kv_put(key="p0", partition_id="train", tag={"status": "pending", "n": 1}))
    r["tags_merged"] = attempt(lambda: tq.kv_put(key="p0", partition_id="train", tag={"status": "running"}))
    keys, td, tags = trajectories(["u1", "u2"], 2, seed=1)
    put = tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=tags)
    put.extra_info["mine"] = 1  # verl assigns into it
    r["batch_put"] = canon(put)
    lp = TensorDict(
        {
            "old_log_probs": torch.nested.as_nested_tensor(
                [torch.full((len(t),), -0.5) for t in td["responses"].unbind()], layout=torch.jagged
            )
        },
        batch_size=[4],
    )
    r["fields_no_tags"] = attempt(lambda: tq.kv_batch_put(keys=keys, partition_id="train", fields=lp))
    r["tag_kept"] = attempt(lambda: tq.kv_list("train")["train"][keys[0]])
    r["partial_write_keeps_columns"] = attempt(lambda: tq.kv_batch_get(keys=keys, partition_id="train"))
    r["key_order"] = attempt(
        lambda: tq.kv_batch_get(keys=keys[::-1], partition_id="train", select_fields=["responses", "extra_fields"])
    )
    one = TensorDict({"vpred": torch.ones(1, 3)}, batch_size=[1])
    tq.kv_batch_put(keys=keys[:1], partition_id="train", fields=one)
    r["common_columns_only"] = attempt(lambda: sorted(tq.kv_batch_get(keys=keys[:2], partition_id="train").keys()))
    r["select_dropped"] = attempt(
        lambda: tq.kv_batch_get(keys=keys[:2], partition_id="train", select_fields=["vpred", "rm_scores"])
    )
    r["select_str"] = attempt(lambda: tq.kv_batch_get(keys=keys[0], partition_id="train", select_fields="vpred"))
    r["missing_key_left_out"] = attempt(lambda: tq.kv_batch_get(keys=[keys[1], "nope"], partition_id="train"))
    r["err_no_key"] = attempt(lambda: tq.kv_batch_get(keys=["nope"], partition_id="train"))
    r["err_no_partition"] = attempt(lambda: tq.kv_batch_get(keys=keys, partition_id="nowhere"))
    r["err_no_shared_column"] = attempt(lambda: tq.kv_batch_get(keys=["p0", keys[0]], partition_id="train"))
    r["err_select_none"] = attempt(lambda: tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["zz"]))
    r["err_put_nothing"] = attempt(lambda: tq.kv_batch_put(keys=["a"], partition_id="train"))
    r["err_put_tags_len"] = attempt(lambda: tq.kv_batch_put(keys=["a", "b"], partition_id="train", tags=[{}]))
    r["err_put_rows"] = attempt(lambda: tq.kv_batch_put(keys=["a"], partition_id="train", fields=one.expand(2)))
    r["kv_list_all"] = attempt(lambda: tq.kv_list())
    r["kv_list_unknown"] = attempt(lambda: tq.kv_list("nowhere"))
    tq.kv_clear(keys=[keys[0]], partition_id="train")
    r["clear_again"] = attempt(lambda: tq.kv_clear(keys=[keys[0], "never"], partition_id="train"))
    r["clear_str"] = attempt(lambda: tq.kv_clear(keys=keys[1], partition_id="train"))
    r["cleared_get"] = attempt(lambda: tq.kv_batch_get(keys=[keys[0]], partition_id="train"))
    r["recreated"] = attempt(lambda: tq.kv_put(key=keys[0], partition_id="train", fields={"x": torch.tensor([7, 8])}))
    r["recreated_get"] = attempt(lambda: tq.kv_batch_get(keys=[keys[0]], partition_id="train"))
    dense = TensorDict({"ids": torch.arange(8).reshape(2, 4), "score": torch.tensor([0.5, 1.5]),
                        "mm": NonTensorStack({"pixel": torch.ones(2, 2)}, {"pixel": torch.zeros(1, 2)})},
                       batch_size=[2])  # fmt: skip
    tq.kv_batch_put(keys=["d0", "d1"], partition_id="val", fields=dense)
    got = tq.kv_batch_get(keys=["d0", "d1"], partition_id="val")
    r["dense_comes_back_jagged"] = canon(got)
    r["padded"] = got["ids"].to_padded_tensor(0).tolist()
    r["kv_list_after"] = attempt(lambda: tq.kv_list())

    async def run_async() -> Any:
        m = await tq.async_kv_batch_put(keys=["a0"], partition_id="val", fields=dense[:1], tags=[{"t": 1}])
        await tq.async_kv_put(key="a0", partition_id="val", tag={"t": 2, "u": 3})
        listed = await tq.async_kv_list("val")
        data = await tq.async_kv_batch_get(keys=["a0", "d1"], partition_id="val", select_fields=["ids"])
        await tq.async_kv_clear(keys=["a0"], partition_id="val")
        return [canon(m), listed, canon(data), await tq.async_kv_list("val")]

    r["async"] = attempt(lambda: asyncio.run(run_async()))
    client = tq.get_client()
    meta = client.kv_retrieve_meta(keys=["d1", "d0", "nope"], partition_id="val", create=False)
    r["retrieve_meta"] = {
        "size": meta.size,
        "fields": meta.field_names,
        "tags": meta.custom_meta,
        "ready": meta.is_ready,
    }
    r["retrieve_keys"] = client.kv_retrieve_keys(global_indexes=meta.global_indexes, partition_id="val")
    r["client_get_data"] = canon(client.get_data(meta.select_fields(["score", "ids"])))
    # clear_partition drops the partition from kv_list; kv_clear of its every key leaves it listed, empty
    tq.kv_batch_put(keys=["c0"], partition_id="cleared", fields=one)
    tq.kv_batch_put(keys=["e0"], partition_id="emptied", fields=one)
    tq.kv_clear(keys=["e0"], partition_id="emptied")
    client.clear_partition("cleared")
    r["cleared_partition_listed"] = {p: v for p, v in tq.kv_list().items() if p in ("cleared", "emptied")}
    return r


@scenario
def batchmeta(tq: Any) -> Any:
    import pickle

    r: dict[str, Any] = {}
    # verl's bridge returns BatchMeta() for ranks that collect nothing; TransferQueue 0.1.11's needs two arguments
    r["no_arg"] = attempt(lambda: [tq.BatchMeta().size, tq.BatchMeta().field_names, tq.BatchMeta().is_ready])
    empty = tq.BatchMeta.empty()
    r["empty"] = [empty.size, empty.field_names, empty.is_ready, empty.extra_info]
    empty.extra_info = {"k": 1}
    r["extra_assign"] = empty.extra_info
    kv = tq.KVBatchMeta(keys=["a", "b", "c"], tags=[{"x": i} for i in range(3)], partition_id="train", fields=["f"])
    r["kv_chunk"] = [canon(c) for c in kv.chunk(chunks=2)]
    r["kv_concat"] = canon(tq.KVBatchMeta.concat(kv.chunk(chunks=3)))
    r["kv_pickle"] = canon(pickle.loads(pickle.dumps(kv)))
    r["kv_dup"] = attempt(lambda: tq.KVBatchMeta(keys=["a", "a"], tags=[{}, {}]))
    kv.reorder([2, 0, 1])
    r["kv_reorder"] = canon(kv)
    r["kv_select"] = canon(kv.select_keys(["c", "a"]))
    import dataclasses

    r["kv_is_dataclass"] = dataclasses.is_dataclass(tq.KVBatchMeta)
    keys, td, tags = trajectories(["b1"], 3, seed=2)
    tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=tags)
    meta = tq.get_client().kv_retrieve_meta(keys=keys, partition_id="train", create=False)
    meta.extra_info["step"] = 3
    parts = meta.chunk(chunks=2)
    r["chunk_sizes"] = [p.size for p in parts]
    back = tq.BatchMeta.concat(parts)
    r["concat"] = [back.size, back.field_names, back.extra_info, back.custom_meta == meta.custom_meta]
    again = pickle.loads(pickle.dumps(back))
    r["pickle"] = [again.size, again.field_names, again.is_ready, again.extra_info]
    r["get_after_pickle"] = canon(tq.get_client().get_data(again.select_fields(["responses"])))
    return r


SCENARIOS.update(VERL_SCENARIOS)


# -- backends ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def backend(name: str, workdir: Path, ray_needed: bool) -> Iterator[Any]:
    import ray

    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent)])}
    if name == "persisting":
        from persisting.compat.transfer_queue import activate

        activate.install()
        shim = workdir / "shim"
        activate.write_shim(shim)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env["PYTHONPATH"]])
        os.environ["XDG_RUNTIME_DIR"] = str(workdir / "run")
    os.environ.update(env)
    started_ray = False
    if ray_needed or name == "transferqueue":
        ray.init(address="local", num_cpus=RAY_CPUS, object_store_memory=300 * 1000**2, include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
        started_ray = True
    try:
        import transfer_queue as tq

        if name == "persisting":
            assert getattr(tq, "BACKEND", None) == "persisting", tq
            tq.init({"persisting": {"storage_path": str(workdir / "data"), "arena_bytes": ARENA_BYTES}})
        else:
            assert getattr(tq, "BACKEND", None) is None, tq
            from omegaconf import OmegaConf

            conf = {"controller": {"polling_mode": True}, "backend": {"SimpleStorage": {"num_data_storage_units": 1}}}
            tq.init(OmegaConf.create(conf, flags={"allow_objects": True}))
        for lname in list(logging.root.manager.loggerDict):
            if lname.startswith(("transfer_queue", "persisting", "verl")):
                logging.getLogger(lname).setLevel(logging.ERROR)
        try:
            yield tq
        finally:
            tq.close()
    finally:
        if started_ray:
            ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["persisting", "transferqueue"], required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    out: dict[str, Any] = {}
    with backend(args.backend, args.workdir, "worker_group" in args.scenarios) as tq:
        for name in args.scenarios:
            for partition, keys in tq.kv_list().items():  # each scenario starts with no key
                if keys:
                    tq.kv_clear(keys=list(keys), partition_id=partition)
            signal.alarm(SCENARIO_TIMEOUT_S)  # verl's samplers poll for ever when a scenario goes wrong
            out[name] = SCENARIOS[name](tq)
            signal.alarm(0)
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
