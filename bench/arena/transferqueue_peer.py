"""The ``arena`` benchmark's TransferQueue 0.1.11 peer: the same batches from a producer process to a consumer
process through TransferQueue's controller and one SimpleStorage unit (Ray actors on this machine, ZeroMQ over
TCP; ``tq_cluster``). The producer ``put``s each batch as a ``TensorDict`` of torch tensors sharing the pool's
memory (``client.put(data=..., partition_id=...)``: insert meta from the controller, the data to the storage unit,
the unit tells the controller); the consumer polls ``client.get_meta(fields, batch, partition, task_name=...)``
(the controller's polling mode answers an empty BatchMeta while fewer samples than asked for are ready; the
consumer then sleeps POLL_S) and reads the batch with ``client.get_data(meta)``, which returns a TensorDict of
nested (jagged) tensors. Each case uses a fresh partition. Run only where ``tq_missing()`` is None."""

from __future__ import annotations

import faulthandler
import time
from typing import Any

from bench.arena.batches import POOL, Shape, make_pool, stamp
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
from bench.common.tq_cluster import TQ_SETTINGS, tq_attach, tq_detach
from bench.common.workers import START_TIMEOUT_S

POLL_S = 0.001  # the consumer's sleep after an empty get_meta
TASK = "train"


def tq_producer_main(spec: dict[str, Any]) -> None:
    import torch
    from tensordict import TensorDict

    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)
    client = None
    try:
        client = tq_attach(spec["address"])
        shape: Shape = spec["shape"]
        np_pool = make_pool(shape, spec["seed"])
        pool = [{k: torch.from_numpy(v) for k, v in b.items()} for b in np_pool]  # shares memory: stamps show
        put_t, start_t, done, part = spec["put_t"], spec["start_t"], spec["received"], spec["partition"]
        for i in range(WARMUP):
            client.put(data=TensorDict(pool[i % POOL], batch_size=shape.rows), partition_id=part)
        spec["barrier"].wait(START_TIMEOUT_S)
        spec["t0"].value = time.monotonic()
        for i in range(spec["batches"]):
            if spec["paced"]:
                while done.value < i:
                    time.sleep(0.001)
                time.sleep(0.002)
            start_t[i] = time.monotonic()
            stamp(np_pool[i % POOL], i)
            client.put(data=TensorDict(pool[i % POOL], batch_size=shape.rows), partition_id=part)
            put_t[i] = time.monotonic()
        spec["consumer_done"].wait(RECV_TIMEOUT_S * 2)
    except BaseException as exc:
        report_failure(spec, "producer", exc)
    finally:
        if client is not None:
            tq_detach(client)


def _get(client: Any, spec: dict[str, Any], timeout_s: float) -> Any:
    shape: Shape = spec["shape"]
    deadline = time.monotonic() + timeout_s
    while True:
        meta = client.get_meta(data_fields=shape.names, batch_size=shape.rows, partition_id=spec["partition"],
                               task_name=TASK)  # fmt: skip
        if len(meta):
            return client.get_data(meta)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no batch of {shape.rows} samples within {timeout_s:g} s")
        time.sleep(POLL_S)


def _stamp_of(data: Any, name: str) -> int:
    return int(data[name][0][0])  # nested (jagged) tensor: sample 0, element 0


def tq_consumer_main(spec: dict[str, Any]) -> None:
    faulthandler.dump_traceback_later(CASE_LIMIT_S - 5)
    client = None
    try:
        client = tq_attach(spec["address"])
        recv_t, done, first = spec["recv_t"], spec["received"], spec["shape"].names[0]
        for _ in range(WARMUP):
            _get(client, spec, START_TIMEOUT_S)
        spec["barrier"].wait(START_TIMEOUT_S)
        for i in range(spec["batches"]):
            data = _get(client, spec, RECV_TIMEOUT_S)
            now = time.monotonic()
            if _stamp_of(data, first) != i:
                raise AssertionError(f"batch {i}: stamp {_stamp_of(data, first)} (order or content broken)")
            if spec["check"] and i == 0:
                report_check(spec, "TransferQueue get_data", {k: data[k] for k in spec["shape"].names})
            del data
            recv_t[i] = now
            done.value = i + 1
    except BaseException as exc:
        report_failure(spec, "consumer", exc)
    finally:
        spec["consumer_done"].set()
        if client is not None:
            tq_detach(client)


def run_tq_case(
    ctx: Any,
    address: str,
    shape: Shape,
    batches: int,
    paced: bool,
    seed: int,
    check: bool,
    result: ArenaBenchResult,
    tick: Tick,
) -> Row:
    mode = "paced" if paced else "stream"
    row = Row.of(
        f"tq-{shape.key}-{mode}",
        "TransferQueue 0.1.11",
        mode,
        shape,
        batches,
        f"{TQ_SETTINGS}; producer put(TensorDict) of the pool's tensors, consumer get_meta (polled every "
        f"{POLL_S * 1e3:g} ms while empty) + get_data; partition tq-{shape.key}-{mode}",
    )
    spec = pair_spec(shape, batches, paced, seed, check, address=address, partition=row.key, consumer_done=ctx.Event())
    run_pair(ctx, tq_producer_main, tq_consumer_main, spec, row, result, tick)
    return row
