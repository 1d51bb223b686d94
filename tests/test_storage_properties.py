"""The storage layer against a model (hypothesis, stateful): random puts of records and tensor batches on both
sides of the compaction and encoder thresholds, layout changes, flushes, maintenance, clears and purges, takes with
samplers, reopens. After every reopen every acknowledged row not cleared is there once, in index order, exact, at
its global index; every bucket is in index order on disk (also after each compaction, before an open could repair
it); a take hands out what the model, a run that never reopens, hands out, and its sampler is given the samples at
the positions they had when they were put.

Each family of operations is its own test (a failure names the family):

    records, tensors, compaction, layout changes, reopens
    + takes with samplers
    + clears and purges (compaction off)
    + clears, purges and compaction        found: a compaction's move lost a fragment's deletion file (fixed)
    + takes after clears and reopens       found on main: sampler positions shifted after a purge (fixed)
    + clears that empty a bucket           found: a layout change in an emptied bucket failed every flush (fixed)
    + record keys like the engine's own names, partition names like the engine's own (issue 37, fixed)

What the families found, shrunk, is a plain test at the end. Flushes, maintenance and purges run only where a rule runs
them (the background flush loop is never woken), so the seed replays a run: ``PERSISTING_TEST_SEED=<seed printed>``,
with ``PERSISTING_PROP_SHRINK=1`` to have hypothesis shrink the failing steps too (minutes).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from persisting import GRPOGroupNSampler, Queue, SequentialSampler
from persisting.client import _loop
from persisting.engine import flushing
from persisting.engine.layout import topic_dirname
from persisting.errors import ConfigError, InvalidRecordError, PersistingError, SchemaConflictError
from persisting.storage import lance_compaction, lance_order, lance_parallel
from persisting.wire.codec import INDEX_KEY, PARTITION_KEY, RESERVED_PREFIX

TOPIC = "prop"
# Thresholds lowered so that KiB-sized batches fall on both sides of them: a 1-sample batch of 8 KiB samples or
# any batch of 64-byte samples is a small fragment (compacted), an 8-sample one of 8 KiB samples goes through two
# encoders in fragments compaction leaves alone (as in production, where both thresholds are 16 MiB).
THRESHOLD_BYTES = 24 * 1024
SAMPLE_FLOATS = (16, 2048)
OPTIONS = {"compact_min_fragments": 2, "target_rows_per_fragment": 4, "retain_seconds": 0.0, "encoders": 2}
NO_COMPACTION = {**OPTIONS, "compact_min_fragments": 10**9}

PLAIN_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "id": st.integers(-(2**63), 2**63 - 1),  # the bucket column
    "a": st.integers(-3, 3),
    "f": st.floats(width=64),
    "s": st.text(max_size=6),
    "b": st.binary(max_size=6),
    "ok": st.booleans(),
    "lab": st.text(max_size=3),  # also a per-sample list riding along tensor batches
}
# Keys that look like the engine's own column names, escapes and separators (column names are percent-escaped;
# a rewrite's temporary column ends in "%23rewrite"; a deduped field's reference column in "%40payload").
ODD_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "s#rewrite": st.text(max_size=4),
    "x#rewrite": st.integers(0, 9),  # the temporary name of tensor field "x"'s column during a layout change
    "y@payload": st.integers(0, 9) | st.text(max_size=4),
    "%23rewrite": st.integers(0, 9),
    "a.b": st.integers(0, 9),
    "_row": st.floats(0, 1),
    "with space": st.text(max_size=4),
    "per%cent": st.integers(0, 9),
    "A": st.integers(0, 9),  # beside "a": Lance column names are case-sensitive
    "ünï😀": st.binary(max_size=4),
}
PLAIN_PARTITIONS = ("p", "q")
KEPT = "kept"  # the partition of rows never cleared (StorageMachine.keep_a_row)
ODD_PARTITIONS = ("p", "_persisting_payloads:p", "q r/ü")  # the second is the dedup payload partition of "p"
TENSOR_FIELDS = ("x", "y")
DTYPES = ("float32", "float32", "float64", "int16", "bool")
TASKS = ("t1", "t2")
KIND_OF = {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes"}


def same(got: Any, want: Any) -> bool:
    """Exact equality: types, dtypes, shapes and bytes of arrays, float bits (NaN included)."""
    if isinstance(want, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and got.tobytes() == want.tobytes()
        )
    if isinstance(want, float):
        bits = struct.pack("<d", want)
        return type(got) is float and (struct.pack("<d", got) == bits or (math.isnan(got) and math.isnan(want)))
    return type(got) is type(want) and got == want


def same_row(got: dict[str, Any], want: dict[str, Any]) -> bool:
    return set(got) == set(want) and all(same(got[k], want[k]) for k in want)


def step(method: Callable[..., None]) -> Callable[..., None]:
    """A rule's body: a failure marks the run broken, so that teardown does not pile a second failure on it."""

    @functools.wraps(method)
    def guarded(self: StorageMachine, **kw: Any) -> None:
        try:
            method(self, **kw)
        except BaseException:
            self.broken = True
            raise

    return guarded


class Seen:
    """A built-in sampler, keeping what the engine gave it: the ready samples and their positions."""

    def __init__(self, inner: SequentialSampler | GRPOGroupNSampler) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], list[int]]] = []

    def window(self, batch_size: int) -> int:
        return self.inner.window(batch_size)

    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        self.calls.append((list(ready), list(kw["positions"])))
        return self.inner.sample(ready, batch_size, **kw)


@dataclass
class Sample:
    partition: str
    row: dict[str, Any]
    cleared: bool = False


class StorageMachine(RuleBasedStateMachine):
    """One topic and its model: ``samples[i]`` is what global index ``i`` holds."""

    clears = False
    takes = False
    odd_keys = False
    # One row in every bucket that is never cleared: no bucket is ever emptied by a purge (the "emptied" family's)
    keep_a_row = True
    bucket_counts = (1, 2)
    partition_names = PLAIN_PARTITIONS
    dtypes = DTYPES
    options = OPTIONS
    prefill = 0  # records put into the first partition at the start (groups for the samplers)
    whole_clears = False  # every clear clears a whole partition

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="persisting-prop-"))
        self.samples: list[Sample] = []
        self.kinds: dict[str, str] = {}
        self.layouts: dict[str, tuple[str, tuple[int, ...]]] = {}  # a tensor field's last (dtype, shape)
        self.taken: dict[tuple[str, str], set[int]] = {}
        self.keys = {**PLAIN_KEYS, **(ODD_KEYS if self.odd_keys else {})}
        self.num_buckets = 1
        self.queue: Queue | None = None
        # What happened since: rows put and not flushed, a flush (for maintain), a clear (for purge), any change
        # (for reopen). Rules that would do nothing wait for them: hypothesis's runs repeat rules a lot.
        self.unflushed = self.flushed = self.unpurged = self.changed = False
        self.broken = False  # a step failed: teardown only cleans up (the failure reported is that step's)

    @initialize(data=st.data())
    @step
    def start(self, data: st.DataObject) -> None:
        self.num_buckets = data.draw(st.sampled_from(self.bucket_counts), label="buckets")
        self.queue = self.run(self.open())
        if self.clears and self.keep_a_row:  # rows without the bucket column go to bucket index % num_buckets
            kept = [{"a": b} for b in range(self.num_buckets)]
            assert self.run(self.q.put_batch(kept, KEPT)) == range(self.accept(KEPT, kept, {"a": "int"}), len(kept))
        if self.prefill:
            rows, partition = [{"a": k % 4} for k in range(self.prefill)], self.partition_names[0]
            first = self.accept(partition, rows, {"a": "int"})
            assert self.run(self.q.put_batch(rows, partition)) == range(first, first + self.prefill)

    # -- plumbing -----------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    async def open(self) -> Queue:
        q = Queue(TOPIC, storage_path=self.dir, num_buckets=self.num_buckets, backend_options=self.options)
        return await q.open()

    @property
    def q(self) -> Queue:
        assert self.queue is not None
        return self.queue

    def engine_call(self, make: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
        topic = self.q._handle.opened.engine_topic  # type: ignore[union-attr]
        return self.run(_loop.call(make(topic)))

    def members(self, partition: str) -> list[int]:
        return [i for i, s in enumerate(self.samples) if s.partition == partition]

    def teardown(self) -> None:
        try:
            if not self.broken and self.queue is not None:
                # Every run ends as the flush loop would (a flush, then maintenance) and with a reopen
                self.run(self.q.flush())
                self.maintain()
                self.reopen(probes=[])
                for partition in self.partition_names if self.takes else ():
                    for task in TASKS:  # and every task takes the rest, in groups
                        self.take_and_check(partition, task, 2, 2 * len(self.samples) + 2)
        finally:
            if self.queue is not None:
                try:
                    self.loop.run_until_complete(self.queue.aclose())
                except Exception:  # the failure that broke the run is the one reported
                    if not self.broken:
                        raise
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- puts ---------------------------------------------------------------------------------------

    def expected_refusal(self, records: list[dict[str, Any]]) -> type[Exception] | None:
        """What encode_batch refuses (checked before an index is assigned), or None."""
        seen: dict[str, str] = {}
        for record in records:
            for key, value in record.items():
                if key.startswith(RESERVED_PREFIX):
                    return InvalidRecordError
                if value is None:
                    continue
                kind = KIND_OF[type(value)]
                if seen.setdefault(key, self.kinds.get(key, kind)) != kind:
                    return SchemaConflictError
        return None

    def accept(self, partition: str, rows: list[dict[str, Any]], kinds: dict[str, str]) -> int:
        first = len(self.samples)
        self.samples.extend(Sample(partition, row) for row in rows)
        self.kinds.update(kinds)
        self.unflushed = self.changed = True
        return first

    def refused_for_a_name(self, exc: Exception, names: list[str]) -> bool:
        """Whether ``exc`` refuses a key or partition that collides with a name the engine uses, naming it: what
        a fix of issue 37 may do instead of keeping it apart."""
        odd = [n for n in names if n in ODD_KEYS or (n in ODD_PARTITIONS and n not in PLAIN_PARTITIONS)]
        return not isinstance(exc, SchemaConflictError) and any(n in str(exc) for n in odd)

    def record(self) -> st.SearchStrategy[dict[str, Any]]:
        keys = st.lists(st.sampled_from(sorted(self.keys)), unique=True, max_size=4)
        return keys.flatmap(lambda ks: st.fixed_dictionaries({k: st.none() | self.keys[k] for k in ks}))

    @rule(data=st.data())
    @step
    def put_records(self, data: st.DataObject) -> None:
        partition = data.draw(st.sampled_from(self.partition_names), label="partition")
        records = data.draw(st.lists(self.record(), min_size=1, max_size=4), label="records")
        # (hypothesis favours 0: the rare cases are at the other end)
        bad = data.draw(st.integers(0, 7), label="bad")  # 7: a reserved key, 6: a value of another kind
        if bad == 7:
            records[-1] = {**records[-1], f"{RESERVED_PREFIX}k": 1}
        elif bad == 6:
            key = data.draw(st.sampled_from(sorted(self.keys)), label="clashing key")
            records[-1] = {**records[-1], key: "1" if self.kinds.get(key, "int") == "int" else 1}
        refusal = self.expected_refusal(records)
        try:
            got = self.run(self.q.put_batch(records, partition))
        except PersistingError as exc:
            named = self.refused_for_a_name(exc, [partition, *(k for r in records for k in r)])
            assert named or (refusal is not None and isinstance(exc, refusal)), f"{exc!r}, expected {refusal}"
            event(f"a put refused: {type(exc).__name__}")
            return
        assert refusal is None, f"put_batch accepted what it must refuse ({refusal.__name__})"
        kinds = {k: KIND_OF[type(v)] for r in records for k, v in r.items() if v is not None}
        first = self.accept(partition, [dict(r) for r in records], kinds)
        assert got == range(first, first + len(records))

    @rule(data=st.data())
    @step
    def put_tensors(self, data: st.DataObject) -> None:
        """A tensor batch: 1 or 8 samples of 64 B or 8 KiB; another shape or dtype of a field changes its layout
        (the column is rewritten)."""
        partition = data.draw(st.sampled_from(self.partition_names), label="partition")
        n = data.draw(st.sampled_from([8, 1]), label="n")
        fields = data.draw(st.lists(st.sampled_from(TENSOR_FIELDS), min_size=1, unique=True), label="fields")
        first = len(self.samples)
        batch: dict[str, Any] = {}
        for f in fields:
            floats = data.draw(st.sampled_from(SAMPLE_FLOATS), label=f"{f} floats")
            shape = data.draw(st.sampled_from([(floats,), (2, floats // 2)]), label=f"{f} shape")
            dtype = data.draw(st.sampled_from(self.dtypes), label=f"{f} dtype")
            values = np.arange(n * floats).reshape(n, *shape) + 1000 * first
            batch[f] = (values % 2).astype(bool) if dtype == "bool" else values.astype(dtype)
            if self.layouts.setdefault(f, (dtype, shape)) != (dtype, shape):
                event("a layout change")
                self.layouts[f] = (dtype, shape)
        labels = data.draw(st.none() | st.lists(st.text(max_size=3), min_size=n, max_size=n), label="lab")
        if labels is not None and self.kinds.get("lab", "str") == "str":
            batch["lab"] = labels
        try:
            meta = self.run(self.q.put(batch, partition_id=partition))
        except PersistingError as exc:
            assert self.refused_for_a_name(exc, [partition]), repr(exc)
            return
        rows = [{k: (v[i] if isinstance(v, list) else v[i].copy()) for k, v in batch.items()} for i in range(n)]
        kinds = {**dict.fromkeys(fields, "ndarray"), **({"lab": "str"} if "lab" in batch else {})}
        assert meta.global_indexes == list(range(self.accept(partition, rows, kinds), first + n))

    # -- Lance's side -------------------------------------------------------------------------------

    @precondition(lambda self: self.unflushed)
    @rule(then_maintain=st.sampled_from([True, False]))
    @step
    def flush(self, then_maintain: bool) -> None:
        """A flush, and the maintenance the flush loop runs after it (or a user's flush: none)."""
        self.run(self.q.flush())
        self.unflushed, self.flushed = False, True
        if then_maintain:
            self.maintain()

    @precondition(lambda self: self.flushed)
    @rule()
    @step
    def maintain(self) -> None:
        """Compaction (and version cleanup), as the background flusher runs it after a flush."""
        self.engine_call(lambda topic: topic.maintain())
        self.flushed = False
        self.check_buckets(purged=False)  # before an open could repair what the compaction did

    # -- clears -------------------------------------------------------------------------------------

    def live(self) -> list[str]:
        """The partitions (of those drawn from) with samples not cleared."""
        return [p for p in self.partition_names if any(not self.samples[i].cleared for i in self.members(p))]

    @precondition(lambda self: self.clears and self.live())
    @rule(data=st.data())
    @step
    def clear(self, data: st.DataObject) -> None:
        partition = data.draw(st.sampled_from(self.live()), label="partition")
        members = self.members(partition)
        if self.whole_clears or data.draw(st.integers(0, 3), label="all") == 3:
            chosen = members
            indexes: list[int] | None = None
        else:
            chosen = data.draw(st.lists(st.sampled_from(members), min_size=1, max_size=4, unique=True), label="ix")
            indexes = chosen
        foreign = [i for i, s in enumerate(self.samples) if s.partition != partition]
        if indexes is not None and foreign and data.draw(st.integers(0, 4), label="foreign") == 4:
            with pytest.raises(ConfigError):  # an index of another partition: refused, nothing cleared
                self.run(self.q.clear([*indexes, data.draw(st.sampled_from(foreign))], partition))
            return
        newly = sum(1 for i in chosen if not self.samples[i].cleared)
        assert self.run(self.q.clear(indexes, partition)) == newly
        for i in chosen:
            self.samples[i].cleared = True
        self.unpurged = self.changed = True

    @precondition(lambda self: self.unpurged)
    @rule()
    @step
    def purge(self) -> None:
        """Cleared rows out of Lance while the topic runs (the flush loop does it every PURGE_SPACING seconds)."""
        self.engine_call(lambda topic: topic._clears.purge_now())
        self.unpurged = False

    # -- takes --------------------------------------------------------------------------------------

    @precondition(lambda self: self.takes and self.live())
    @rule(data=st.data())
    @step
    def take(self, data: st.DataObject) -> None:
        partition = data.draw(st.sampled_from(self.live()), label="partition")
        task = data.draw(st.sampled_from(TASKS), label="task")
        n = data.draw(st.sampled_from([0, 2, 4]), label="grpo n")
        self.take_and_check(partition, task, n, data.draw(st.integers(0, 3), label="batch") * (n or 2))

    def take_and_check(self, partition: str, task: str, n: int, batch: int) -> None:
        """A take with GRPOGroupNSampler(n) (0: the default sampler): what the model hands out, the sampler given
        the ready samples at their positions."""
        sampler = Seen(GRPOGroupNSampler(n) if n else SequentialSampler())
        members = self.members(partition)
        done = self.taken.setdefault((partition, task), set())
        # A sample's position in its partition never changes: cleared samples before it still count.
        ready = [i for i in members if not self.samples[i].cleared and i not in done]
        positions = [members.index(i) for i in ready]
        want, consumed = sampler.inner.sample(ready, batch, positions=positions)
        meta = self.run(self.q.get_meta(batch_size=batch, task_name=task, partition_id=partition, sampler=sampler))
        for given, at in sampler.calls:  # the whole ready list, or its front (the sampler's window)
            shown = f"the sampler was given {given} at positions {at}; ready: {ready} at {positions}"
            assert given == ready[: len(given)] and at == positions[: len(given)], shown
        assert meta.global_indexes == want, f"{sampler.inner.name}(n={n}) batch={batch}"
        done.update(consumed)
        self.changed = True

    # -- reopen and the checks ----------------------------------------------------------------------

    @precondition(lambda self: self.changed)
    @rule(probes=st.lists(st.integers(0, 10**6), max_size=4))
    @step
    def reopen(self, probes: list[int]) -> None:
        self.run(self.q.aclose())
        self.queue = None
        self.queue = self.run(self.open())
        self.unflushed = self.unpurged = self.changed = False
        self.flushed = True
        self.check_buckets(purged=True)  # a clean close flushed and purged everything; the open repaired nothing
        self.run(self.check_reads(probes))

    async def check_reads(self, probes: list[int]) -> None:
        alive = [(i, s) for i, s in enumerate(self.samples) if not s.cleared]
        got = await self.q.get(limit=len(self.samples) + 8)
        assert len(got) == len(alive), f"{len(got)} rows read, {len(alive)} acknowledged and not cleared"
        for row, (i, s) in zip(got, alive, strict=True):
            assert same_row(row, s.row), f"index {i}: read {row!r}, stored {s.row!r}"
        for probe in probes if self.samples else []:
            i = probe % len(self.samples)  # a read at one global index: the row is at its own position
            one = await self.q.get(limit=1, offset=i)
            want = [] if self.samples[i].cleared else [self.samples[i].row]
            assert len(one) == len(want) and all(map(same_row, one, want)), f"get(1, {i}): {one!r}"
        listed = await self.q.partitions()
        for partition in {s.partition for s in self.samples}:
            left = sum(1 for i in self.members(partition) if not self.samples[i].cleared)
            assert listed.get(partition, {}).get("samples") == left, f"{partition!r}: {listed.get(partition)}"

    def buckets(self) -> list[Path]:
        return sorted((self.dir / topic_dirname(TOPIC)).glob("bucket-*.lance"))

    def check_buckets(self, purged: bool) -> None:
        """Every bucket in index order; once flushed and purged (after a reopen), the buckets together hold each
        acknowledged sample not cleared once, with its partition."""
        stored: list[tuple[int, str]] = []
        for path in self.buckets():
            ds = lance.dataset(str(path))
            problem = lance_order.disorder(ds)
            assert problem is None, f"{path.name}: {problem}"
            table = ds.to_table(columns=[INDEX_KEY, PARTITION_KEY])
            stored += zip(table[INDEX_KEY].to_pylist(), table[PARTITION_KEY].to_pylist(), strict=True)
        if purged:
            alive = [(i, s.partition) for i, s in enumerate(self.samples) if not s.cleared]
            assert sorted(stored) == alive, "the buckets do not hold each acknowledged sample once"


# -- the families ------------------------------------------------------------------------------------------------


@pytest.fixture
def thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lower thresholds, and flushes, maintenance and purges only where a rule runs them: the background flush
    loop is never woken (it would race the steps, and hypothesis could not replay a failing run)."""
    monkeypatch.setattr(flushing.Flusher, "want", lambda self: None)
    monkeypatch.setattr(lance_compaction, "COMPACT_BELOW_BYTES", THRESHOLD_BYTES)
    monkeypatch.setattr(lance_parallel, "MIN_ENCODER_BYTES", THRESHOLD_BYTES)
    monkeypatch.setattr(lance_parallel, "PIPELINE_BYTES", THRESHOLD_BYTES)


def check(seed: int, examples: int = 20, steps: int = 20, **family: Any) -> None:
    machine = type("Machine", (StorageMachine,), family)
    run_state_machine_as_test(
        hypothesis_seed(seed)(machine),
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,  # the printed seed alone replays a run
            # Shrinking a failing run takes minutes (each step is real I/O): on request only, when replaying
            phases=[Phase.generate, *([Phase.shrink] if os.environ.get("PERSISTING_PROP_SHRINK") else [])],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


@pytest.mark.usefixtures("thresholds")
def test_records_and_tensors_through_compaction_layout_changes_and_reopens(seed: int) -> None:
    check(seed)


@pytest.mark.usefixtures("thresholds")
def test_takes_with_samplers(seed: int) -> None:
    check(seed, takes=True)


@pytest.mark.usefixtures("thresholds")
def test_clears_and_purges(seed: int) -> None:
    """Without compaction: with it, see test_clears_purges_and_compaction."""
    check(seed, clears=True, options=NO_COMPACTION)


@pytest.mark.usefixtures("thresholds")
def test_clears_purges_and_compaction(seed: int) -> None:
    check(seed, clears=True)


@pytest.mark.usefixtures("thresholds")
def test_takes_after_clears_and_reopens(seed: int) -> None:
    check(seed, clears=True, takes=True, options=NO_COMPACTION, partition_names=("p",), prefill=16)


@pytest.mark.usefixtures("thresholds")
def test_clears_that_empty_buckets(seed: int) -> None:
    emptied = {"keep_a_row": False, "whole_clears": True, "bucket_counts": (1,), "partition_names": ("p",)}
    check(seed, clears=True, options=NO_COMPACTION, dtypes=DTYPES[1:3], **emptied)


@pytest.mark.usefixtures("thresholds")
def test_odd_record_keys(seed: int) -> None:
    check(seed, odd_keys=True)


@pytest.mark.usefixtures("thresholds")
def test_odd_partition_names(seed: int) -> None:
    check(seed, partition_names=ODD_PARTITIONS)


# -- what the families found, shrunk (each failed before its fix) -----------------------------------------------


def test_a_layout_change_in_a_bucket_that_a_purge_emptied(store: Path) -> None:
    """test_clears_that_empty_buckets found it: Lance's add_columns cannot convert the column of a dataset without
    rows (a TypeError), at this flush, every later one, the close and every open's replay; the column is now added
    empty (storage/lance_columns.rewrite_column)."""

    async def main() -> list[dict[str, Any]]:
        async with Queue("emptied", storage_path=store, num_buckets=1) as q:
            await q.put({"x": np.zeros((1, 4), np.float32)}, partition_id="p")
            await q.flush()
            await q.clear([0], "p")  # the close purges the bucket's only row
        async with Queue("emptied", storage_path=store, num_buckets=1) as q:
            await q.put({"x": np.ones((1, 4), np.float64)}, partition_id="p")  # another dtype: a new layout
            await q.flush()
        async with Queue("emptied", storage_path=store, num_buckets=1) as q:
            return await q.get(limit=10)

    rows = asyncio.run(main())
    assert len(rows) == 1 and same_row(rows[0], {"x": np.ones(4, np.float64)})


def test_a_compaction_that_moves_a_fragment_with_deleted_rows(store: Path) -> None:
    """test_clears_purges_and_compaction: lance_order gives a moved fragment a new id, and Lance finds a deletion
    file by its fragment's id (``_deletions/<fragment id>-<version>-<n>.arrow``), so the rows deleted from it are
    looked for under a name no file has: every read and every later open fails."""
    options = {"compact_min_fragments": 2, "target_rows_per_fragment": 4, "retain_seconds": 0.0}

    async def main() -> list[dict[str, Any]]:
        async with Queue("moved", storage_path=store, num_buckets=1, backend_options=options) as q:
            for n in (1, 1, 16):  # two 1-row fragments (a compaction's run), then one it leaves where it is
                await q.put_batch([{"a": k} for k in range(n)], "p")
                await q.flush()
            await q.clear([5], "p")  # a row of the 16-row fragment: the close purges it (a deletion file)
        async with Queue("moved", storage_path=store, num_buckets=1, backend_options=options) as q:
            await _loop.call(q._handle.opened.engine_topic.maintain())  # type: ignore[union-attr]
        async with Queue("moved", storage_path=store, num_buckets=1, backend_options=options) as q:
            return await q.get(limit=100)

    assert [r["a"] for r in asyncio.run(main())] == [0, 0, *range(3), *range(4, 16)]
