"""The ``arena`` benchmark's reference path, ``torch.multiprocessing.Queue``: the producer allocates shared-memory
tensors per batch (``torch.empty(...).share_memory_()``), copies the same data in (the same one copy), ``put``s a
dict of them; the consumer's blocking ``get`` maps them (file-descriptor strategy). ``put`` returns before the
feeder thread has pickled and sent anything. torch is imported only when this case runs (``--no-torch`` runs
without it)."""

from __future__ import annotations

import faulthandler
import time
from typing import Any

from bench.arena.batches import POOL, Shape, make_pool, read_all, stamp, stamp_of
from bench.arena.pair import (
    CASE_LIMIT_S,
    RECV_TIMEOUT_S,
    WARMUP,
    ArenaBenchResult,
    Row,
    pair_spec,
    report_check,
    report_failure,
    run_pair,
)
from bench.common.measure import Tick
from bench.common.torch_shared import shared_copy
from bench.common.workers import START_TIMEOUT_S


def torch_producer_main(spec: dict[str, Any]) -> None:
    import torch

    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)
    try:
        shape: Shape = spec["shape"]
        pool = [{k: torch.from_numpy(v) for k, v in b.items()} for b in make_pool(shape, spec["seed"])]
        put_t, start_t, done, q = spec["put_t"], spec["start_t"], spec["received"], spec["queue"]
        for i in range(WARMUP):
            q.put({name: t.clone().share_memory_() for name, t in pool[i % POOL].items()})
        spec["barrier"].wait(START_TIMEOUT_S)
        spec["t0"].value = time.monotonic()
        for i in range(spec["batches"]):
            if spec["paced"]:
                while done.value < i:
                    time.sleep(0.001)
                time.sleep(0.002)
            start_t[i] = time.monotonic()
            src = pool[i % POOL]
            stamp(src, i)
            out = {name: shared_copy(t) for name, t in src.items()}
            q.put(out)
            put_t[i] = time.monotonic()
            del out
        spec["consumer_done"].wait(RECV_TIMEOUT_S * 2)  # the fds must stay servable until the consumer has them
    except BaseException as exc:
        report_failure(spec, "producer", exc)


def torch_consumer_main(spec: dict[str, Any]) -> None:
    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)
    try:
        recv_t, done, q = spec["recv_t"], spec["received"], spec["queue"]
        for _ in range(WARMUP):
            q.get(timeout=START_TIMEOUT_S)
        spec["barrier"].wait(START_TIMEOUT_S)
        for i in range(spec["batches"]):
            data = q.get(timeout=RECV_TIMEOUT_S)
            if spec.get("reads"):
                read_all(data)
            now = time.monotonic()
            if stamp_of(data) != i:
                raise AssertionError(f"batch {i}: stamp {stamp_of(data)} (order or content broken)")
            if spec["check"] and i == 0:
                report_check(spec, "torch.multiprocessing.Queue get", data)
            del data
            recv_t[i] = now
            done.value = i + 1
    except BaseException as exc:
        report_failure(spec, "consumer", exc)
    finally:
        spec["consumer_done"].set()


def run_torch_case(
    shape: Shape,
    batches: int,
    paced: bool,
    seed: int,
    check: bool,
    result: ArenaBenchResult,
    tick: Tick,
    reads: bool = False,
) -> Row:
    import torch.multiprocessing as tmp

    mode = "paced" if paced else "stream"
    row = Row.of(
        f"torch-{shape.key}-{mode}",
        "torch.multiprocessing.Queue",
        mode,
        shape,
        batches,
        f"spawn context, sharing strategy {tmp.get_sharing_strategy()}; producer copies each batch into fresh "
        "share_memory_() tensors, put(dict); consumer get() (blocking)",
    )
    tctx = tmp.get_context("spawn")
    spec = pair_spec(shape, batches, paced, seed, check, queue=tctx.Queue(), consumer_done=tctx.Event(), reads=reads)
    run_pair(tctx, torch_producer_main, torch_consumer_main, spec, row, result, tick)
    return row
