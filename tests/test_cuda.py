"""GPU checks, marked ``cuda``: ``./dev test -m cuda`` on a machine with a GPU runs this file only (about a minute;
docs/contributing.md). Everywhere else they are skipped with the reason.

A real broker, tensor batches put from a CUDA device (the producer copies device -> shared memory) and read back
with ``get_data(device="cuda")``, every byte compared; and ``Queue(pin_memory=True)`` (tensors/pinning.py):
its shared mappings are page-locked, checked through CUDA's own API, not by timing (``Tensor.is_pinned``:
cudaPointerGetAttributes; after ``close`` a ``cudaHostUnregister`` of the range finds nothing registered).
What pinning gains in copy speed is measured, not asserted (docs/guides/tensors.md, "GPUs: pinned shared memory").
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import Queue
from persisting.client.connection import connection
from persisting.tensors import pinning
from persisting.tensors.arena import HEADER_BYTES, default_path
from persisting.tensors.segment import Segment

from .broker_fixture import BrokerProcess, running_broker
from .segment_worker import mappings

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA device (torch.cuda.is_available() is False): run `./dev test -m cuda` on a GPU machine",
    ),
]

ARENA_BYTES = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def gpu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module's pinned queues (its arena stays pinned in this process once a queue pinned it)."""
    with running_broker(tmp_path_factory.mktemp("cuda"), ["--arena-bytes", str(ARENA_BYTES)]) as b:
        yield b


@pytest.fixture(autouse=True)
def _no_pin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pinning.ENV, raising=False)  # each test says what it wants


def _same_bytes(got: Any, want: Any) -> bool:
    """Same dtype, shape and bytes (bfloat16 and NaN included), wherever each lies."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    as_bytes = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for t in (got, want)]
    return bool(torch.equal(*as_bytes))


def _gpu_batch(n: int, seed: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "f32": torch.randn(n, 4096, device="cuda", generator=g),
        "bf16": torch.randn(n, 1024, device="cuda", generator=g).to(torch.bfloat16),
        "i64": torch.randint(0, 2**62, (n, 32), device="cuda", generator=g),
        "u8": torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device="cuda", generator=g),
        "f16_strided": torch.randn(n, 64, device="cuda", generator=g).half()[:, ::2],  # non-contiguous source
        "uid": [f"u{i}" for i in range(n)],
    }


TENSORS = ("f32", "bf16", "i64", "u8", "f16_strided")


async def _holds(address: str) -> int:
    return int((await connection(address).request("hello", {})).result["arena_stats"]["holds"])


async def _no_holds_within(address: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while await _holds(address) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return await _holds(address) == 0


def test_a_gpu_batch_through_pinned_shared_memory(gpu_broker: BrokerProcess) -> None:
    """Put from the GPU, read to the GPU from the pinned mapping (the hold goes back at once: the result is device
    memory), read to the host as private views: every byte, every dtype, each way."""

    async def main() -> None:
        async with Queue("gpu", broker=gpu_broker.address, pin_memory=True) as q:
            assert q.pin_memory
            batch = _gpu_batch(64, seed=1)
            meta = await q.put(batch, partition_id="gpu")  # CUDA tensors: staged to the host, into the arena
            got = await q.get_data(meta, device="cuda")
            for name in TENSORS:
                assert got[name].device.type == "cuda", name
                assert _same_bytes(got[name], batch[name]), name
            assert got["uid"] == batch["uid"]
            assert await _no_holds_within(gpu_broker.address, 5.0), "the device read kept its hold"
            host = await q.get_data(meta)  # no device: copy-on-write views of the arena, never pinned
            for name in TENSORS:
                assert host[name].device.type == "cpu" and _same_bytes(host[name], batch[name]), name
                assert not host[name].is_pinned(), name
            host[TENSORS[0]].add_(1)  # the consumer's own pages (copy-on-write): the stored batch is unchanged
            again = await q.get_data(meta, device="cuda")
            assert _same_bytes(again[TENSORS[0]], batch[TENSORS[0]])

    asyncio.run(main())


def test_a_reservation_filled_from_the_gpu_lies_in_pinned_memory(gpu_broker: BrokerProcess) -> None:
    async def main() -> None:
        async with Queue("reserved", broker=gpu_broker.address, pin_memory=True) as q:
            src = torch.randn(16, 4096, device="cuda")
            ids = torch.arange(16 * 8, device="cuda").reshape(16, 8)
            spec = {"x": ((4096,), torch.float32), "ids": ((8,), torch.int64)}
            async with q.reserve(spec, batch_size=16, partition_id="r") as r:
                assert r.in_arena and r["x"].is_pinned() and r["ids"].is_pinned()  # the pinned shared mapping
                r["x"].copy_(src, non_blocking=True)  # a DMA from the device straight into the broker's memory
                r["ids"].copy_(ids, non_blocking=True)
                torch.cuda.current_stream().synchronize()  # before the put: the bytes must be there
                meta = await q.put(r)
            got = await q.get_data(meta, device="cuda")
            assert _same_bytes(got["x"], src) and _same_bytes(got["ids"], ids)

    asyncio.run(main())


def test_samples_of_several_puts_are_joined_on_the_device(gpu_broker: BrokerProcess) -> None:
    async def main() -> None:
        async with Queue("joined", broker=gpu_broker.address, pin_memory=True) as q:
            parts = [torch.randn(8, 256, device="cuda") for _ in range(3)]
            for part in parts:
                await q.put({"x": part}, partition_id="j")
            meta = await q.get_meta(["x"], 24, "train", "j")
            assert meta.size == 24
            got = await q.get_data(meta, device="cuda")
            assert got["x"].device.type == "cuda" and _same_bytes(got["x"], torch.cat(parts))
            nested = torch.nested.nested_tensor(
                [torch.randn(k, 16, device="cuda") for k in (3, 1, 5)], layout=torch.jagged
            )
            meta = await q.put({"seq": nested}, partition_id="nested")
            back = (await q.get_data(meta, device="cuda"))["seq"]
            assert back.is_nested and back.device.type == "cuda"
            for a, b in zip(back.unbind(), nested.unbind(), strict=True):
                assert _same_bytes(a, b)

    asyncio.run(main())


def test_without_the_option_nothing_is_pinned(broker: BrokerProcess) -> None:
    """A broker of its own (no pinned queue ever mapped its arena in this process): the default pins nothing,
    and the same GPU batches go through it unchanged."""

    async def main() -> None:
        async with Queue("plain", broker=broker.address) as q:
            assert q.pin_memory is False
            batch = _gpu_batch(32, seed=2)
            meta = await q.put(batch, partition_id="p")
            got = await q.get_data(meta, device="cuda")
            for name in TENSORS:
                assert got[name].device.type == "cuda" and _same_bytes(got[name], batch[name]), name
            async with q.reserve({"x": ((64,), torch.float32)}, batch_size=4, partition_id="p") as r:
                assert r.in_arena and not r["x"].is_pinned()

    asyncio.run(main())


def _unregister_elsewhere(address: int) -> int:
    """``cudaHostUnregister(address)`` in a thread of its own: the error it returns when nothing is registered
    there stays CUDA's last error of that thread, not of the one the next tests launch kernels from."""
    out: list[int] = []
    device = torch.cuda.current_device()

    def run() -> None:
        torch.cuda.set_device(device)
        out.append(int(torch.cuda.cudart().cudaHostUnregister(address)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def test_a_segment_is_registered_while_mapped_and_unregistered_at_close(gpu_broker: BrokerProcess) -> None:
    path = default_path(gpu_broker.storage)
    seg = Segment.attach(path)  # a mapping of its own, apart from the Queues'
    try:
        assert not torch.from_numpy(seg.view(HEADER_BYTES, 4096, writable=True)).is_pinned()  # mapped, not pinned
        seg.pin()
        view = seg.view(HEADER_BYTES, 4096, writable=True)
        assert seg.pinned and torch.from_numpy(view).is_pinned()
        start = view.ctypes.data - HEADER_BYTES
        assert _mapped(start, path)
        host = torch.from_numpy(np.array(view))  # a copy, pageable: the pin is the mapping's, not the bytes'
        assert not host.is_pinned()
        del view
    finally:
        seg.close()
    assert not _mapped(start, path), "close() left the mapping (a view still alive?)"
    assert _unregister_elsewhere(start) != 0, "close() left the range registered"


def _mapped(address: int, path: Path) -> bool:
    """Whether ``address`` lies in a mapping of ``path`` in this process now."""
    return any(lo <= address < hi and name == str(path) for lo, hi, name in mappings())
