"""Queue.reserve: a tensor batch the producer fills in place and puts without a copy, through a real broker (its
arena in /dev/shm, a producer SIGKILLed holding a reservation, a broker SIGKILLed between reserve and put) and
in embedded mode."""

from __future__ import annotations

import asyncio
import gc
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from persisting import (
    ConfigError,
    Full,
    InvalidRecordError,
    Queue,
    Reservation,
    SchemaConflictError,
    SyncQueue,
    SyncReservation,
)
from persisting.client.connection import connection
from persisting.tensors.arena import HEADER_BYTES, default_path

from .broker_fixture import BrokerProcess, make_broker

WORKER = Path(__file__).with_name("reserve_worker.py")
ARENA_BYTES = 8 * 1024 * 1024
DATA_BYTES = ARENA_BYTES - HEADER_BYTES  # what the arena can lease in all
pytestmark = pytest.mark.slow

# numpy and torch fields, bool and bfloat16, 0-d samples: the spec every round trip reserves
SPEC: dict[str, tuple[Any, Any]] = {
    "obs": ((64,), np.float32),
    "ids": ((16,), "int64"),
    "mask": ((3, 2), np.bool_),
    "score": ((), np.float64),  # one value per sample
    "lp": ((8,), torch.bfloat16),
    "flag": ((), torch.bool),
    "m": ((), torch.bfloat16),
}
N = 12


@pytest.fixture
def unstarted(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = make_broker(tmp_path)
    b.extra_args = ["--arena-bytes", str(ARENA_BYTES)]
    try:
        yield b
    finally:
        b.ensure_dead()


@pytest.fixture
def broker(unstarted: BrokerProcess) -> Iterator[BrokerProcess]:
    unstarted.start()
    yield unstarted
    if unstarted.proc is not None and unstarted.proc.poll() is None:
        assert unstarted.stop() == 0
    assert not default_path(unstarted.storage).exists(), "a clean stop must remove the arena file"


async def _arena_stats(address: str) -> dict[str, Any]:
    stats: dict[str, Any] = (await connection(address).request("hello", {})).result["arena_stats"]
    return stats


async def _until(address: str, check: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = await _arena_stats(address)
        if check(stats) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.05)


def _shm_ranges() -> list[tuple[int, int]]:
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/dev/shm/persisting-"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


def _address(value: Any) -> int:
    return int(value.data_ptr()) if isinstance(value, torch.Tensor) else int(value.ctypes.data)


def _file_offset(value: Any) -> int | None:
    """Where ``value``'s memory lies in the arena file, through whichever mapping of it holds the address."""
    address = _address(value)
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/dev/shm/persisting-"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return int(parts[2], 16) + address - lo
    return None


def _in_shared_mapping(value: Any) -> bool:
    start = _address(value)
    nbytes = value.numel() * value.element_size() if isinstance(value, torch.Tensor) else value.nbytes
    return any(lo <= start and start + nbytes <= hi for lo, hi in _shm_ranges())


def _values(rng: np.random.Generator, n: int = N) -> dict[str, Any]:
    return {
        "obs": rng.standard_normal((n, 64)).astype(np.float32),
        "ids": rng.integers(-(2**40), 2**40, size=(n, 16)),
        "mask": rng.random((n, 3, 2)) < 0.5,
        "score": rng.standard_normal(n),
        "lp": torch.from_numpy(rng.standard_normal((n, 8)).astype(np.float32)).to(torch.bfloat16),
        "flag": torch.from_numpy(rng.random(n) < 0.5),
        "m": torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16),
    }


def _fill(r: Reservation | SyncReservation, values: dict[str, Any]) -> None:
    for name, value in values.items():
        r[name][...] = value


def _check_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert isinstance(got[name], torch.Tensor) and got[name].dtype == value.dtype, name
            assert torch.equal(got[name], value), name
        else:
            assert isinstance(got[name], np.ndarray) and got[name].dtype == value.dtype, name
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def _check_reserved_arrays(r: Reservation) -> None:
    for name, (shape, _dtype) in SPEC.items():
        arr = r[name]
        assert tuple(arr.shape) == (N, *shape), name
        if isinstance(arr, torch.Tensor):
            assert arr.dtype == SPEC[name][1], name
        else:
            assert arr.dtype == np.dtype(SPEC[name][1]) and arr.flags.writeable, name


def test_round_trip_through_the_arena_without_a_copy(broker: BrokerProcess, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = _values(rng)
    uids = [f"u{i}" for i in range(N)]

    async def go() -> None:
        async with Queue("rt", broker=broker.address) as q:
            r = await q.reserve(SPEC, batch_size=N, partition_id="p")
            assert r.in_arena and r.state == "open" and sorted(r) == sorted(SPEC) and len(r) == len(SPEC)
            _check_reserved_arrays(r)
            for name in SPEC:
                assert _in_shared_mapping(r[name]), f"{name} is not inside the /dev/shm arena mapping"
            stats = await _arena_stats(broker.address)
            assert stats["leased_extents"] == 1 and stats["sealed_extents"] == 0
            _fill(r, values)
            where = {name: _file_offset(r[name]) for name in SPEC}
            meta = await q.put(r, extra={"uid": uids})
            assert meta is not None and meta.global_indexes == list(range(N)) and r.state == "put"
            moved = (await q.stats())["zerocopy"]
            assert moved["put_zero_copy_bytes"] == r.nbytes and moved["put_copied_bytes"] == 0

            # The consumer's views are the very bytes the producer wrote: the same offsets of the arena file (the
            # consumer's own copy-on-write mapping of it), so put copied nothing (a copy would live elsewhere).
            data = await q.get_data(await q.get_meta(None, N, "train", "p"))
            _check_equal(data, values)
            assert data["uid"] == uids
            for name in SPEC:
                assert where[name] is not None and _file_offset(data[name]) == where[name], name
            assert (await q.stats())["zerocopy"]["get_copied_bytes"] == 0

            # The same BatchMeta as put(data, partition_id) of the same batch gives.
            plain = await q.put({**values, "uid": uids}, partition_id="p2")
            assert plain is not None
            assert [s.fields for s in meta.samples] == [s.fields for s in plain.samples]
            assert meta.samples[0].fields["m"].shape == () and meta.samples[0].fields["lp"].dtype == "bfloat16"

            assert data["obs"].flags.writeable  # the consumer's side of the same bytes: its own to change

            # Spent: nothing can be put twice or read through it.
            with pytest.raises(ConfigError, match=r"was put .*global indexes 0\.\.11"):
                await q.put(r)
            with pytest.raises(ConfigError, match="was put"):
                r["obs"]
            assert await r.abandon() is False
            assert len(q) == 2 * N

    asyncio.run(go())


def test_the_producer_s_arrays_become_read_only_once_put(broker: BrokerProcess) -> None:
    async def go() -> None:
        async with Queue("ro", broker=broker.address) as q:
            r = await q.reserve({"x": ((4,), np.int32)}, 2, "p")
            x = r["x"]
            x[:] = 3
            await q.put(r)
            with pytest.raises(ValueError, match="read-only"):
                x[0, 0] = 4  # would change a stored batch under its consumers
            got = await q.get_data(await q.get_meta(["x"], 2, "t", "p"))
            assert (got["x"] == 3).all()

    asyncio.run(go())


def test_a_reservation_writes_fields_of_samples_that_exist(broker: BrokerProcess) -> None:
    async def go() -> None:
        async with Queue("patch", broker=broker.address) as q:
            meta = await q.put({"x": np.arange(4, dtype=np.int64)}, partition_id="p")
            assert meta is not None
            assert (await q.get_meta(["x", "reward"], 4, "train", "p")).size == 0  # waits for its reward
            r = await q.reserve({"reward": ((), np.float32)}, 4, "p")
            assert r.in_arena
            r["reward"][:] = [0.5, 1.5, 2.5, 3.5]
            with pytest.raises(ConfigError, match="holds 4 samples but batch_meta names 2"):
                await q.put(r, batch_meta=meta.select_samples([0, 1]))
            done = await q.put(r, batch_meta=meta)
            assert done is not None and done.global_indexes == meta.global_indexes and "reward" in done.field_names
            got = await q.get_data(await q.get_meta(["x", "reward"], 4, "train", "p"))
            np.testing.assert_array_equal(got["reward"], np.array([0.5, 1.5, 2.5, 3.5], np.float32))
            np.testing.assert_array_equal(got["x"], np.arange(4))

    asyncio.run(go())


def test_round_trip_in_embedded_mode(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = _values(rng)

    async def go() -> None:
        async with Queue("emb", storage_path=tmp_path / "data") as q:
            r = await q.reserve(SPEC, batch_size=N, partition_id="p")
            assert not r.in_arena
            _check_reserved_arrays(r)
            assert not any(_in_shared_mapping(r[name]) for name in SPEC)
            _fill(r, values)
            meta = await q.put(r, extra={"uid": list(range(N))})
            assert meta is not None and meta.global_indexes == list(range(N))
            assert (await q.stats())["zerocopy"]["put_copied_bytes"] == r.nbytes
            got = await q.get_data(meta)
            _check_equal(got, values)
            assert got["uid"] == list(range(N))
            plain = await q.put({**values, "uid": list(range(N))}, partition_id="p2")
            assert plain is not None and [s.fields for s in meta.samples] == [s.fields for s in plain.samples]
            with pytest.raises(ConfigError, match="was put"):
                await q.put(r)
        async with Queue("emb", storage_path=tmp_path / "data") as q:  # persisted like any put
            _check_equal(await q.get_data(await q.get_meta(list(SPEC), N, "after", "p")), values)
        async with Queue("emb", storage_path=tmp_path / "data", zerocopy_mode="force") as q:
            with pytest.raises(ConfigError, match="needs broker mode"):
                await q.reserve(SPEC, N, "p")

    asyncio.run(go())


def test_abandon_leaving_the_block_and_garbage_collection_free_the_extent(broker: BrokerProcess) -> None:
    spec = {"x": ((1024,), np.float32)}

    async def go() -> None:
        async with Queue("ab", broker=broker.address) as q:
            r = await q.reserve(spec, 256, "p")
            stats = await _arena_stats(broker.address)
            assert stats["leased_extents"] == 1 and stats["leased_bytes"] == 256 * 4096
            assert await r.abandon() is True and r.state == "abandoned"
            stats = await _arena_stats(broker.address)
            assert stats["leased_extents"] == 0 and stats["free_bytes"] == DATA_BYTES
            assert await q.abandon(r) is False  # once is enough
            with pytest.raises(ConfigError, match=r"was abandoned .*abandon\(\)"):
                await q.put(r)
            with pytest.raises(ConfigError, match="was abandoned"):
                dict(r.data)

            async with q.reserve(spec, 256, "p") as r:
                r["x"][:] = 1.0
                assert (await _arena_stats(broker.address))["leased_extents"] == 1
            assert r.state == "abandoned" and (await _arena_stats(broker.address))["leased_extents"] == 0

            with pytest.raises(RuntimeError, match="producer failed"):
                async with q.reserve(spec, 256, "p") as r:
                    raise RuntimeError("producer failed")
            assert r.state == "abandoned" and (await _arena_stats(broker.address))["leased_extents"] == 0

            async with q.reserve(spec, 4, "p") as r:  # put inside the block: leaving it changes nothing
                r["x"][:] = 2.0
                await q.put(r)
            assert r.state == "put" and len(q) == 4

            # Dropped without put or abandon: given back once its last array is gone, not before.
            stats = await _until(broker.address, lambda s: s["leased_extents"] == 1)  # the spare of the put
            r = await q.reserve(spec, 256, "p")
            x = r["x"]
            del r
            gc.collect()
            await asyncio.sleep(0.2)
            assert (await _arena_stats(broker.address))["leased_extents"] == 1  # x still points into it
            x[:] = 3.0
            del x
            gc.collect()
            stats = await _until(broker.address, lambda s: s["leased_extents"] == 0)
            assert stats["leased_extents"] == 0

            r = await q.reserve(spec, 16, "p")
        # closing the queue gave the open reservation back
        assert r.state == "abandoned" and (await _arena_stats(broker.address))["leased_extents"] == 0
        with pytest.raises(ConfigError, match="when its queue was closed"):
            r["x"]

    asyncio.run(go())


def test_sync_queue_reserves_too(broker: BrokerProcess, tmp_path: Path, seed: int) -> None:
    values = _values(np.random.default_rng(seed))
    for options in ({"broker": broker.address}, {"storage_path": tmp_path / "sync"}):
        with SyncQueue("sq", **options) as q:
            with q.reserve(SPEC, N, "p") as r:
                assert isinstance(r, SyncReservation) and r.in_arena == ("broker" in options)
                _fill(r, values)
                meta = q.put(r, extra={"k": ["a"] * N})
            assert r.state == "put" and meta.global_indexes == list(range(N))
            _check_equal(q.get_data(meta), values)
            with q.reserve({"x": ((8,), np.uint8)}, 2, "p") as r:
                pass
            assert r.state == "abandoned" and q.abandon(r) is False
            with pytest.raises(ConfigError, match="was abandoned"):
                q.put(r)
            r = q.reserve({"x": ((8,), np.uint8)}, 2, "p")
            assert r.abandon() is True
            if "broker" in options:
                stats = asyncio.run(_arena_stats(broker.address))
                assert stats["leased_extents"] <= 1  # at most the spare its put leased ahead
            assert len(q) == N


def test_a_producer_killed_holding_a_reservation_gives_it_back(broker: BrokerProcess) -> None:
    nbytes = DATA_BYTES - 64 * 1024  # nearly all of the arena
    proc = subprocess.Popen([sys.executable, str(WORKER), broker.address, "dead", str(nbytes)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:2] == [b"RESERVED", b"True"], line

        async def go() -> None:
            stats = await _arena_stats(broker.address)
            assert stats["leased_extents"] == 1 and stats["free_bytes"] == 64 * 1024
            async with Queue("dead", broker=broker.address, zerocopy_mode="force") as q:
                with pytest.raises(Full):  # the reservation pins the arena while its producer lives
                    await q.put({"x": np.zeros((1, DATA_BYTES), np.uint8)}, partition_id="p", timeout=0.5)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                stats = await _until(broker.address, lambda s: s["leased_extents"] == 0)
                assert stats["leased_extents"] == 0 and stats["free_bytes"] == DATA_BYTES
                assert len(q) == 0 and await q.partitions() == {}  # nothing of it became visible
                meta = await q.put({"x": np.full((1, DATA_BYTES), 7, np.uint8)}, partition_id="p", timeout=5)
                assert meta is not None and meta.global_indexes == [0]
                got = await q.get_data(meta)
                assert int(got["x"].min()) == int(got["x"].max()) == 7  # none of the dead producer's 0xAB bytes

        asyncio.run(go())
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_reservation_survives_a_broker_restart_before_its_put(unstarted: BrokerProcess) -> None:
    """Extent ids start again at 1 in a restarted broker: reservations made before the restart must neither seal
    nor free the extents of the same ids this process then reserves from the new broker."""
    spec = {"x": ((1000,), np.int32)}

    async def go() -> None:
        unstarted.start()
        async with Queue("restart", broker=unstarted.address) as q:
            old, old_abandoned = await q.reserve(spec, 4, "p"), await q.reserve(spec, 4, "p")
            old["x"][:] = 1
            unstarted.kill()
            unstarted.start()
            new, new_other = await q.reserve(spec, 4, "p"), await q.reserve(spec, 4, "p")
            # the collision this test is about (private fields, read to make sure it happens)
            assert old._lease is not None and new._lease is not None and old._lease.extent == new._lease.extent
            assert (await _arena_stats(unstarted.address))["leased_extents"] == 2
            new["x"][:] = 2
            old["x"][0, 0] = 1  # still writable: the old arena's bytes live on in this process's mapping of it

            assert await old_abandoned.abandon() is True
            assert (await _arena_stats(unstarted.address))["leased_extents"] == 2, "freed the new broker's extent"

            meta_old = await q.put(old)  # refused as stale by the new broker, then copied once into a new extent
            meta_new = await q.put(new)
            assert meta_old is not None and meta_new is not None
            assert ((await q.get_data(meta_old))["x"] == 1).all()
            assert ((await q.get_data(meta_new))["x"] == 2).all()
            assert len(q) == 8
            await new_other.abandon()
        assert unstarted.stop() == 0

    asyncio.run(go())


def test_off_mode_no_arena_and_batches_larger_than_the_arena(broker: BrokerProcess, tmp_path: Path) -> None:
    big = {"x": ((ARENA_BYTES // 2,), np.uint8)}

    async def go() -> None:
        async with Queue("off", broker=broker.address, zerocopy_mode="off") as q:
            r = await q.reserve({"x": ((16,), np.int16)}, 4, "p")
            assert not r.in_arena and not _in_shared_mapping(r["x"])
            r["x"][:] = np.arange(64, dtype=np.int16).reshape(4, 16)
            meta = await q.put(r)
            assert meta is not None and (await q.stats())["zerocopy"]["put_copied_bytes"] == 128
            np.testing.assert_array_equal((await q.get_data(meta))["x"], np.arange(64).reshape(4, 16))
        async with Queue("big", broker=broker.address) as q:
            r = await q.reserve(big, 3, "p")  # 12 MiB > 8 MiB: plain memory, the put goes over the socket
            assert not r.in_arena
            r["x"][:] = 9
            meta = await q.put(r)
            assert meta is not None and (await q.stats())["zerocopy"]["put_copied_bytes"] == 3 * ARENA_BYTES // 2
            assert int((await q.get_data(meta))["x"].min()) == 9
        async with Queue("big", broker=broker.address, zerocopy_mode="force") as q:
            with pytest.raises(ConfigError, match="larger than the arena"):
                await q.reserve(big, 3, "p")
            assert (await _arena_stats(broker.address))["leased_extents"] <= 1

    asyncio.run(go())

    bare = make_broker(tmp_path / "bare")
    bare.extra_args = ["--arena-bytes", "0"]
    try:
        bare.start()

        async def no_arena() -> None:
            async with Queue("na", broker=bare.address) as q:
                r = await q.reserve({"x": ((4,), np.float32)}, 2, "p")
                assert not r.in_arena
                r["x"][:] = 0.5
                meta = await q.put(r)
                assert meta is not None and float((await q.get_data(meta))["x"].sum()) == 4.0
            async with Queue("na", broker=bare.address, zerocopy_mode="force") as q:
                with pytest.raises(ConfigError, match="without an arena"):
                    await q.reserve({"x": ((4,), np.float32)}, 2, "p")

        asyncio.run(no_arena())
        assert bare.stop() == 0
    finally:
        bare.ensure_dead()


BAD_SPECS: list[tuple[Any, type[Exception], str]] = [
    ([("x", ((4,), np.float32))], InvalidRecordError, "non-empty dict"),
    ({}, InvalidRecordError, "non-empty dict"),
    ({"": ((4,), np.float32)}, InvalidRecordError, "field names"),
    ({"_persisting_x": ((4,), np.float32)}, InvalidRecordError, "_persisting_"),
    ({"x": np.float32}, InvalidRecordError, "field 'x': the spec gives"),
    ({"x": ((4,), np.float32, 1)}, InvalidRecordError, "field 'x': the spec gives"),
    ({"x": ((4,), None)}, InvalidRecordError, "field 'x': no dtype"),
    ({"x": ((4,), "floatx")}, InvalidRecordError, "field 'x': 'floatx' is not a dtype"),
    ({"x": ((4,), "bfloat16")}, InvalidRecordError, "pass torch.bfloat16"),
    ({"x": ((4,), object)}, InvalidRecordError, "field 'x': dtype '|O' cannot go in a tensor batch"),
    ({"x": ((4,), "U8")}, InvalidRecordError, "field 'x': dtype '<U8' cannot go in a tensor batch"),
    ({"x": ((4,), torch.uint16)}, InvalidRecordError, "field 'x': torch dtype 'uint16' is not supported"),
    ({"x": ((-1,), np.float32)}, InvalidRecordError, r"field 'x': the sample shape .* got \(-1,\)"),
    ({"x": ((1.5,), np.float32)}, InvalidRecordError, "field 'x': the sample shape"),
    ({"x": ("4", np.float32)}, InvalidRecordError, "field 'x': the sample shape"),
    ({"x": ((True,), np.float32)}, InvalidRecordError, "field 'x': the sample shape"),
]


@pytest.mark.parametrize(("spec", "error", "match"), BAD_SPECS)
def test_bad_specs_name_what_is_wrong(tmp_path: Path, spec: Any, error: type[Exception], match: str) -> None:
    async def go() -> None:
        async with Queue("bad", storage_path=tmp_path / "data") as q:
            with pytest.raises(error, match=match):
                await q.reserve(spec, 4, "p")

    asyncio.run(go())


def test_bad_arguments_and_a_second_put_are_refused(tmp_path: Path) -> None:
    spec = {"x": ((4,), np.float32)}

    async def go() -> None:
        async with Queue("args", storage_path=tmp_path / "data") as q, Queue("other", storage_path=tmp_path / "d") as o:
            for batch_size in (-1, 1.5, True, "4", None):
                with pytest.raises(ConfigError, match="batch_size must be an int >= 0"):
                    await q.reserve(spec, batch_size, "p")  # type: ignore[arg-type]
            with pytest.raises(InvalidRecordError, match="partition_id"):
                await q.reserve(spec, 4, "")
            with pytest.raises(ConfigError, match="timeout"):
                await q.reserve(spec, 4, "p", timeout=-1)

            r = await q.reserve(spec, 4, "p")
            r["x"][:] = 1.0
            bad_extras: list[tuple[Any, str]] = [
                ({"uid": [1, 2, 3]}, "has 3 values; the reservation has 4"),
                ({"uid": np.arange(4)}, "give a list with one value per sample"),
                ({"x": [1, 2, 3, 4]}, "also a field of the reservation"),
                ([1, 2, 3, 4], "extra must be a dict"),
                ({"uid": [{1, 2}] * 4}, "uid"),
            ]
            for extra, match in bad_extras:
                with pytest.raises(InvalidRecordError, match=match):
                    await q.put(r, extra=extra)
            with pytest.raises(ConfigError, match="for partition 'p', not 'q'"):
                await q.put(r, partition_id="q")
            with pytest.raises(ConfigError, match="belongs to"):
                await o.put(r)
            with pytest.raises(ConfigError, match="belongs to"):
                await o.abandon(r)
            with pytest.raises(ConfigError, match=r"await q\.reserve"):
                await q.put(q.reserve(spec, 4, "p"))
            with pytest.raises(ConfigError, match="extra= goes with put"):
                await q.put({"x": np.zeros((4, 4))}, partition_id="p", extra={"uid": [1, 2, 3, 4]})
            assert r.state == "open" and len(q) == 0  # every refusal above left it open and stored nothing
            meta = await q.put(r, extra={"uid": [1, 2, 3, 4]})
            assert meta is not None and meta.global_indexes == [0, 1, 2, 3]
            with pytest.raises(ConfigError, match=r"was put .*cannot be put again"):
                await q.put(r)
            twice = await asyncio.gather(q.put(r2 := await q.reserve(spec, 4, "p")), q.put(r2), return_exceptions=True)
            assert isinstance(twice[1], ConfigError) and "in progress" in str(twice[1]), twice
            assert len(q) == 8

            # a field stored as numpy cannot be reserved as torch (refused before anything is leased)
            with pytest.raises(SchemaConflictError, match="'x' is stored as ndarray"):
                await q.reserve({"x": ((4,), torch.float32)}, 4, "p")

            # an empty batch, as put of one: nothing stored, an empty meta
            empty = await q.reserve(spec, 0, "p")
            assert (await q.put(empty)).size == 0 and len(q) == 8  # type: ignore[union-attr]

    asyncio.run(go())
