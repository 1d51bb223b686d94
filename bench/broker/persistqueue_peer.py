"""The ``broker`` benchmark's peer: the same 2x2 shape through ``persistqueue.SQLiteAckQueue(path,
multithreading=True)`` opened by each process on one shared path: ``put`` per record, ``get(block=False)`` +
``ack`` per record. persist-queue is not multi-process safe; the run is bounded in records and seconds and counts
duplicates and losses instead of failing."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import numpy as np
import persistqueue

from bench.broker.throughput import PUT_BATCH, Throughput
from bench.common.measure import Tick
from bench.common.records import make_records
from bench.common.workers import START_TIMEOUT_S, gather, guarded, join_all, span, watch, worker, write_result

PQ_POLL_S = 0.001  # sleep between empty polls: its blocking get waits on a put event that is per process, and so
# would poll only every 10 s across processes


def pq_producer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {"errors": 0, "error_examples": []}
    ids: list[int] = []
    guarded(spec, info, lambda: _pq_produce(spec, info, ids))
    write_result(spec["out"], info, np.asarray(ids, dtype=np.int64))


def _pq_produce(spec: dict[str, Any], info: dict[str, Any], ids: list[int]) -> None:
    count, counter = spec["count"], spec["counter"]
    records = make_records(count, spec["seed"], start=spec["index"] * count)
    q = persistqueue.SQLiteAckQueue(spec["path"], multithreading=True)
    spec["barrier"].wait(START_TIMEOUT_S)
    info["t0"] = t0 = time.monotonic()
    end = t0 + spec["limit_s"]
    for n, rec in enumerate(records, 1):
        if time.monotonic() >= end:
            info["stopped_at_limit"] = True
            break
        try:
            q.put(rec)
            ids.append(rec["id"])
        except Exception as exc:  # e.g. sqlite3.OperationalError: database is locked
            _note_error(info, exc)
        if n % PUT_BATCH == 0:
            with counter.get_lock():
                counter.value += PUT_BATCH
    info["t1"] = time.monotonic()
    del q


def _note_error(info: dict[str, Any], exc: Exception) -> None:
    info["errors"] += 1
    if len(info["error_examples"]) < 3:
        info["error_examples"].append(repr(exc))


def pq_consumer_main(spec: dict[str, Any]) -> None:
    info: dict[str, Any] = {"errors": 0, "error_examples": [], "ack_misses": 0}
    ids: list[int] = []
    guarded(spec, info, lambda: _pq_consume(spec, info, ids))
    write_result(spec["out"], info, np.asarray(ids, dtype=np.int64))


def _pq_consume(spec: dict[str, Any], info: dict[str, Any], ids: list[int]) -> None:
    counter, done = spec["counter"], spec["producers_done"]
    q = persistqueue.SQLiteAckQueue(spec["path"], multithreading=True)
    spec["barrier"].wait(START_TIMEOUT_S)
    info["t0"] = t0 = time.monotonic()
    info["t1"] = t0
    end = t0 + spec["limit_s"]
    while time.monotonic() < end:
        finished = done.is_set()  # read before the get: an empty queue after this means no more records
        try:
            item = q.get(block=False)
        except persistqueue.Empty:
            if finished:
                break
            time.sleep(PQ_POLL_S)
            continue
        except Exception as exc:
            _note_error(info, exc)
            continue
        ids.append(int(item["id"]))
        info["t1"] = time.monotonic()
        try:
            if q.ack(item) is None:
                info["ack_misses"] += 1
        except Exception as exc:
            _note_error(info, exc)
        if len(ids) % PUT_BATCH == 0:
            with counter.get_lock():
                counter.value += PUT_BATCH
    else:
        info["stopped_at_limit"] = True
    del q


def run_persistqueue_2x2(total: int, limit_s: float, work: Path, seed: int, tick: Tick) -> Throughput:
    ctx = multiprocessing.get_context("spawn")
    producers, consumers = 2, 2
    per_producer = total // producers
    path = work / "sqlite-ack"
    persistqueue.SQLiteAckQueue(str(path), multithreading=True)  # create the table before 4 processes race to do it
    barrier = ctx.Barrier(producers + consumers + 1)
    counter = ctx.Value("q", 0)
    producers_done = ctx.Event()
    common = {"path": str(path), "barrier": barrier, "counter": counter, "limit_s": limit_s}
    prods = [
        worker(
            ctx,
            pq_producer_main,
            {**common, "index": i, "count": per_producer, "seed": seed, "out": str(work / f"pq-producer-{i}")},
            f"producer-{i}",
        )
        for i in range(producers)
    ]
    cons = [
        worker(
            ctx,
            pq_consumer_main,
            {**common, "producers_done": producers_done, "out": str(work / f"pq-consumer-{i}")},
            f"consumer-{i}",
        )
        for i in range(consumers)
    ]
    row = Throughput(
        "sqlite-ack",
        "persistqueue.SQLiteAckQueue",
        "multithreading=True, auto_commit=True (its only mode), one instance per process on one shared path; "
        "2 producers put() one record at a time, 2 consumers get(block=False) + ack() each record; "
        f"bounded at {total:,} records and {limit_s:g} s per worker",
        total,
    )
    for p in [*prods, *cons]:
        p.start()
    seen = 0
    try:
        barrier.wait(START_TIMEOUT_S)
        seen = watch(prods, counter, tick, timeout=limit_s + 60)
    except Exception as exc:
        row.errors.append(f"start failed: {exc!r}")
    row.errors += join_all(prods, timeout=limit_s + 60)
    producers_done.set()
    watch(cons, counter, tick, timeout=limit_s + 60, seen=seen)
    row.errors += join_all(cons, timeout=limit_s + 60)

    t0s: list[float] = []
    prod_t1: list[float] = []
    cons_t1: list[float] = []
    put_ids: list[np.ndarray] = []
    got_ids: list[np.ndarray] = []
    limited = False
    errors = 0
    examples: list[str] = []
    ack_misses = 0
    for p, info, ids in gather([*prods, *cons], lambda p: work / f"pq-{p.name}", row.errors):
        errors += int(info.get("errors", 0))
        examples += info.get("error_examples", [])
        ack_misses += int(info.get("ack_misses", 0))
        limited |= bool(info.get("stopped_at_limit"))
        if "t0" in info:
            t0s.append(info["t0"])
        is_producer = p.name.startswith("producer")
        if "t1" in info:
            (prod_t1 if is_producer else cons_t1).append(info["t1"])
        if ids is not None:
            (put_ids if is_producer else got_ids).append(ids)
    put = np.concatenate(put_ids) if put_ids else np.empty(0, dtype=np.int64)
    got = np.concatenate(got_ids) if got_ids else np.empty(0, dtype=np.int64)
    row.produced = len(put)
    row.consumed = len(got)
    uniq = np.unique(got)
    row.unique = len(uniq)
    row.duplicates = row.consumed - row.unique
    row.produce_s = span(t0s, prod_t1)
    row.consume_s = span(t0s, cons_t1)
    after = persistqueue.SQLiteAckQueue(str(path), multithreading=True, auto_resume=False)
    # status: 0 put, never got; 1 nack'ed or resumed; 2 got, not acked; 5 acked (its ready_count() misses 0)
    waiting, unack, acked = after.qsize(), after.unack_count(), after.acked_count()
    after.resume_unack_tasks()  # what a restarted consumer would see again
    left_ids: list[int] = []
    while True:
        try:
            left_ids.append(int(after.get(block=False)["id"]))
        except persistqueue.Empty:
            break
    row.left = len(left_ids)
    left = np.asarray(left_ids, dtype=np.int64)
    row.lost = len(np.setdiff1d(np.unique(put), np.union1d(uniq, left)))
    row.notes.append(
        f"after the run the table holds {acked:,} acked rows, {waiting:,} never handed out and {unack:,} handed out "
        f"but not acked; {ack_misses:,} ack() calls found no row; {errors:,} exceptions in put/get/ack"
        + (f" (e.g. {examples[0]})" if examples else "")
        + f"; {row.duplicates:,} records were handed to both consumers (get() selects a row, then marks it, "
        "without a lock that spans processes)"
    )
    if limited:
        row.notes.append(f"stopped by the {limit_s:g} s limit before all {total:,} records were through")
    return row
