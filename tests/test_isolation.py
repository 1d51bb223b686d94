"""Consumer isolation: whatever a consumer does to what get_data / get_batch gave it never changes a stored batch,
for any other consumer or in storage, in embedded and broker mode (plain, TensorDict, reservations), and never
crashes the consumer. See docs/concepts/consumer-isolation.md."""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from persisting import Queue
from persisting.client.connection import connection

from .broker_fixture import BrokerProcess, in_arena_mapping

ARENA_BYTES = 8 * 1024 * 1024
N = 8
pytestmark = pytest.mark.slow


def _originals() -> dict[str, Any]:
    return {
        "x": np.arange(N * 1024, dtype=np.float32).reshape(N, 1024),
        "t": torch.arange(N * 512, dtype=torch.int64).reshape(N, 512),
        "b": torch.full((N, 64), 1.5, dtype=torch.bfloat16),
    }


def _check_original(data: Any, what: str) -> None:
    want = _originals()
    np.testing.assert_array_equal(np.asarray(data["x"]), want["x"], err_msg=what)
    assert torch.equal(data["t"], want["t"]), what
    assert torch.equal(data["b"], want["b"]), what


def _scribble_torch(data: Any) -> None:
    """The ways a consumer writes in place through torch (the code before the fix let them reach the arena)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch on a read-only numpy array (the code before the fix)
        torch.from_numpy(np.asarray(data["x"])).add_(1)  # a normalisation in torch over a numpy field
    data["t"].add_(7)
    data["t"] += 1
    data["b"].mul_(0)


def _scribble_numpy(data: Any) -> None:
    x = data["x"]
    x += 1  # numpy in place: the array is the consumer's to change (read-only, ValueError, before the fix)
    x[0, :4] = -1


def _scribble(data: Any) -> None:
    _scribble_torch(data)
    _scribble_numpy(data)


async def _holds(address: str) -> int:
    return int((await connection(address).request("hello", {})).result["arena_stats"]["holds"])


async def _until_no_holds(address: str) -> None:
    deadline = time.monotonic() + 10
    while await _holds(address) and time.monotonic() < deadline:
        gc.collect()
        await asyncio.sleep(0.05)
    assert await _holds(address) == 0


async def _put(q: Queue, how: str) -> None:
    if how == "reserve":
        spec = {"x": ((1024,), np.float32), "t": ((512,), torch.int64), "b": ((64,), torch.bfloat16)}
        r = await q.reserve(spec, N, "p")
        for name, value in _originals().items():
            r[name][:] = value
        await q.put(r)
    else:
        await q.put(_originals(), partition_id="p")


async def _get(q: Queue, task: str, tensordict: bool) -> Any:
    meta = await q.get_meta(["x", "t", "b"], N, task, "p")
    assert meta.size == N
    return await q.get_data(meta, as_tensordict=tensordict)


async def _scribbled_then_read(q: Queue, how: str, tensordict: bool, broker: str | None) -> None:
    await _put(q, how)
    mine = await _get(q, "a", tensordict)
    if broker is not None:
        assert in_arena_mapping(np.asarray(mine["x"]).ctypes.data)  # zero-copy: a view of the arena file
    _scribble_torch(mine)
    # A second task in the same process (a second hold on the same extent), then a write-behind flush.
    _check_original(await _get(q, "b", tensordict), "another task after an in-place write")
    _scribble_numpy(mine)
    assert float(mine["x"][1, 0]) == 1024 + 2 and int(mine["t"][0, 1]) == 1 + 8  # the consumer sees its writes
    await q.flush()
    _check_original(await _get(q, "c", tensordict), "another task after the flush")
    assert float(mine["x"][1, 0]) == 1024 + 2  # the writer's own view is unchanged by all that
    del mine
    if broker is not None:
        await _until_no_holds(broker)
        # Evict the flushed extent (a lease that needs the whole arena): the samples now come from Lance.
        await q.put({"big": np.zeros((1, ARENA_BYTES - 3 * 4096), np.uint8)}, partition_id="big")
        from_lance = await _get(q, "d", tensordict)
        assert not in_arena_mapping(np.asarray(from_lance["x"]).ctypes.data)
        _check_original(from_lance, "read back from Lance after eviction")


@pytest.mark.parametrize("how", ["put", "reserve"])
@pytest.mark.parametrize("tensordict", [False, True], ids=["dict", "tensordict"])
def test_in_place_writes_never_reach_the_broker_s_batch(
    arena_broker: BrokerProcess, how: str, tensordict: bool
) -> None:
    if tensordict:
        pytest.importorskip("tensordict")

    async def go() -> None:
        async with Queue("iso", broker=arena_broker.address) as q:
            await _scribbled_then_read(q, how, tensordict, arena_broker.address)

    asyncio.run(go())
    arena_broker.stop()
    arena_broker.start()  # a restart reads what the log and Lance hold

    async def after() -> None:
        async with Queue("iso", broker=arena_broker.address) as q:
            _check_original(await _get(q, "after-restart", tensordict), "after a broker restart")

    asyncio.run(after())


@pytest.mark.parametrize("tensordict", [False, True], ids=["dict", "tensordict"])
def test_in_place_writes_never_reach_the_stored_batch_embedded(tmp_path: Path, tensordict: bool) -> None:
    if tensordict:
        pytest.importorskip("tensordict")

    async def go() -> None:
        async with Queue("iso", storage_path=tmp_path / "data") as q:
            await _scribbled_then_read(q, "put", tensordict, None)
        async with Queue("iso", storage_path=tmp_path / "data") as q:
            _check_original(await _get(q, "after-reopen", tensordict), "after a reopen (from Lance)")

    asyncio.run(go())


def test_writes_after_release_and_after_the_broker_is_gone_do_not_crash(arena_broker: BrokerProcess) -> None:
    """A consumer may write into its arrays at any time: after an explicit release(), after the broker was
    killed (its arena file unlinked): no SIGSEGV, no SIGBUS, and the next broker's data is untouched."""

    async def go() -> None:
        async with Queue("late", broker=arena_broker.address) as q:
            await q.put(_originals(), partition_id="p")
            data = await _get(q, "a", False)
            data.release()
            _scribble(data)
            arena_broker.kill()
            _scribble(data)
            assert float(data["x"][1, 0]) == 1024 + 4
        arena_broker.start()
        async with Queue("late", broker=arena_broker.address) as q:
            _check_original(await _get(q, "b", False), "after the killed broker's restart")

    asyncio.run(go())
