"""The ``samples`` benchmark's TransferQueue 0.1.11 peer: its ``get_meta`` in the shape of persisting's idle
reference. After persisting's broker is gone, Ray and TransferQueue start (``tq_cluster``) with the controller's
sampler ``transfer_queue.GRPOGroupNSampler(n_samples_per_prompt=8)``; in this process, TransferQueue's own client
(``transfer_queue.get_client()``, its sync API) keeps partition ``p`` at 64-128 ready, unconsumed samples by
untimed ``put``s of the same 64-sample batches (``{"x": float32[64, 16], "len": 64 ints}`` as a TensorDict), and
times ``get_meta(data_fields=["x"], batch_size=16, partition_id="p", task_name="train")`` (consume-on-fetch, 2
whole groups per call) over the same number of calls after the same warm-up. Run only where ``tq_missing()`` is
None; otherwise the row says why."""

from __future__ import annotations

import time
from typing import Any

from bench.common.measure import Tick
from bench.common.tq_cluster import tq_cluster, tq_missing
from bench.samples.result import FEATURES, GROUP_N, PUT_ROWS, TAKE, SamplesBenchResult, whole_groups


def run_tq_reference(n: int, warmup: int, result: SamplesBenchResult, tick: Tick) -> None:
    state = tq_missing()
    result.settings["transferqueue"] = state or "measured"
    if state is not None:
        return
    import transfer_queue as tq

    try:
        _measure(tq, n, warmup, result, tick)
    except Exception as exc:  # Ray or TransferQueue would not start: persisting's rows stand, the note says why
        result.settings["transferqueue"] = f"failed: {exc!r}"


def _measure(tq: Any, n: int, warmup: int, result: SamplesBenchResult, tick: Tick) -> None:
    import torch
    from tensordict import TensorDict

    with tq_cluster(tq.GRPOGroupNSampler(n_samples_per_prompt=GROUP_N)):
        client = tq.get_client()
        batch = TensorDict({"x": torch.zeros(PUT_ROWS, FEATURES), "len": torch.arange(PUT_ROWS)}, batch_size=PUT_ROWS)
        left = 0  # ready, unconsumed samples in the partition
        for i in range(warmup + n):
            while left < 2 * PUT_ROWS:  # untimed refill, as persisting's reference does
                client.put(data=batch, partition_id="p")
                left += PUT_ROWS
            t0 = time.perf_counter_ns()
            meta = client.get_meta(data_fields=["x"], batch_size=TAKE, partition_id="p", task_name="train")
            dt_us = (time.perf_counter_ns() - t0) / 1e3
            left -= len(meta)
            if len(meta) != TAKE or not whole_groups(list(meta.global_indexes)):
                raise RuntimeError(f"get_meta returned {list(meta.global_indexes)}, not {TAKE // GROUP_N} groups")
            if i >= warmup:
                result.tq.samples_us.append(dt_us)
            tick(1)
