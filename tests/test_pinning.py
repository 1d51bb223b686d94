"""Pinned shared memory (``Queue(pin_memory=True)``, tensors/pinning.py) without a GPU: off, it does nothing and
imports nothing; on without CUDA, the Queue's construction raises a ConfigError naming what is missing; and the
registration's lifecycle (whole shared mappings, once, unregistered before the munmap, private mappings never)
against a fake CUDA runtime. tests/test_cuda.py runs the real thing where a GPU exists."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from persisting import Queue
from persisting.errors import ConfigError
from persisting.tensors import arena as arena_mod
from persisting.tensors import pinning
from persisting.tensors.arena import HEADER_BYTES, SEGMENT_SHIFT, Arena, default_path
from persisting.tensors.segment import Segment

from .broker_fixture import BrokerProcess
from .segment_worker import mappings


def _mapped(address: int, path: Path) -> bool:
    """Whether ``address`` lies in a mapping of ``path`` in this process now."""
    return any(lo <= address < hi and name == str(path) for lo, hi, name in mappings())


class FakeCudart:
    """The calls ``pinning`` makes of torch's CUDA runtime binding (CUDA's names), recorded; ``refuse``: the error
    code of a refused registration. An unregister records whether its range was still mapped (it must be)."""

    def __init__(self, files: list[Path], refuse: int = 0) -> None:
        self.files = files
        self.refuse = refuse
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[tuple[int, bool]] = []

    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:
        self.registered.append((address, nbytes, flags))
        return self.refuse

    def cudaHostUnregister(self, address: int) -> int:
        self.unregistered.append((address, any(_mapped(address, f) for f in self.files)))
        return 0

    def cudaError(self, code: int) -> int:
        return code

    def cudaGetErrorString(self, code: int) -> str:
        return "operation not supported"


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pinning.ENV, raising=False)


def test_off_does_nothing_and_imports_no_torch(tmp_path: Path, no_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # any import of torch now raises ImportError

    def no_cuda() -> Any:
        raise AssertionError("pinning is off: nothing may call CUDA")

    monkeypatch.setattr(pinning, "_cudart", no_cuda)
    assert pinning.resolve(None) is False and pinning.resolve(False) is False
    monkeypatch.setenv(pinning.ENV, "0")
    assert pinning.resolve(None) is False
    q = Queue("t", storage_path=str(tmp_path / "data"))
    assert q.pin_memory is False
    owner = Segment.create(tmp_path / "seg", 64 * 1024, uuid.uuid4().bytes)
    client = Segment.attach(owner.path)
    try:
        client.view(HEADER_BYTES, 4096, writable=True)[:] = 7  # the shared mapping, made: not pinned
        assert client.private(HEADER_BYTES, 4096)[0] == 7
        assert not client.pinned
    finally:
        client.close()
        owner.close()


def test_on_without_cuda_fails_at_the_queue(tmp_path: Path, no_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/test_cuda.py covers pinning there")
    with pytest.raises(ConfigError, match=r"pin_memory=True .* CPU-only build; install a CUDA build of torch"):
        Queue("t", storage_path=str(tmp_path / "data"), pin_memory=True)
    monkeypatch.setenv(pinning.ENV, "1")
    with pytest.raises(ConfigError, match=rf"{pinning.ENV}=1 .*unset {pinning.ENV}"):
        Queue("t", storage_path=str(tmp_path / "data"))
    assert Queue("t", storage_path=str(tmp_path / "data"), pin_memory=False).pin_memory is False  # the arg wins


def test_on_without_torch_and_bad_values(no_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ConfigError, match="torch is not installed; install a CUDA build of torch, or pass"):
        pinning.resolve(True)
    with pytest.raises(ConfigError, match="pin_memory must be True, False or None"):
        pinning.resolve("yes")  # type: ignore[arg-type]
    monkeypatch.setenv(pinning.ENV, "yes")
    with pytest.raises(ConfigError, match=f"{pinning.ENV} must be 1 .* or 0"):
        pinning.resolve(None)


def test_a_shared_mapping_is_pinned_whole_once_and_unpinned_before_its_munmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "seg"
    cuda = FakeCudart([path])
    monkeypatch.setattr(pinning, "_cudart", lambda: cuda)
    owner = Segment.create(path, 64 * 1024, uuid.uuid4().bytes)
    with pytest.raises(ValueError, match="the broker does not pin"):
        owner.pin()
    client = Segment.attach(path)
    try:
        private = client.private(HEADER_BYTES, 4096)
        assert cuda.registered == []  # a private mapping is never pinned, nor does it make the shared one
        client.pin()
        view = client.view(HEADER_BYTES, 4096, writable=True)
        client.view(HEADER_BYTES + 4096, 4096)
        assert client.pinned and len(cuda.registered) == 1  # once per mapping, whatever the views
        address, nbytes, flags = cuda.registered[0]
        assert (address, nbytes, flags) == (view.ctypes.data - HEADER_BYTES, client.size_bytes, 1)  # portable
        del view
        client.close()
        assert cuda.unregistered == [(address, True)]  # unregistered while still mapped
        assert not _mapped(address, path) and not client.pinned
        del private
    finally:
        owner.close()


def test_close_with_live_views_unpins_for_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapping that views keep alive past ``close`` is unmapped by the garbage collector later, where nothing
    could unregister it first: it is unregistered at ``close`` and never registered again."""
    path = tmp_path / "seg"
    cuda = FakeCudart([path])
    monkeypatch.setattr(pinning, "_cudart", lambda: cuda)
    owner = Segment.create(path, 64 * 1024, uuid.uuid4().bytes)
    client = Segment.attach(path)
    try:
        client.pin()
        view = client.view(HEADER_BYTES, 4096)
        client.close()
        assert len(cuda.unregistered) == 1 and cuda.unregistered[0][1]
        assert _mapped(view.ctypes.data, path)  # kept by the view, readable, unpinned
        assert len(cuda.registered) == 1 and not client.pinned
    finally:
        owner.close()


def test_a_refused_registration_raises_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "seg"
    monkeypatch.setattr(pinning, "_cudart", lambda: FakeCudart([path], refuse=801))
    owner = Segment.create(path, 64 * 1024, uuid.uuid4().bytes)
    client = Segment.attach(path)
    try:
        with pytest.raises(ConfigError, match=r"cannot page-lock .* operation not supported \(801\).* unpinned"):
            client.pin()
        assert not client.pinned
    finally:
        client.close()
        owner.close()


def test_an_arena_pins_segment_0_now_and_others_at_their_first_shared_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "arena"
    cuda = FakeCudart([path, path.with_name("arena.1")])
    monkeypatch.setattr(pinning, "_cudart", lambda: cuda)
    owner = Arena.create(path, 64 * 1024)
    owner.add(1, owner.new_segment(1, 64 * 1024))
    client = Arena.attach(path, owner.generation)
    try:
        client.pin()
        client.pin()  # idempotent
        assert [n for _a, n, _f in cuda.registered] == [64 * 1024]  # segment 0, mapped now
        one = (1 << SEGMENT_SHIFT) + HEADER_BYTES
        client.private(one, 4096)
        assert len(cuda.registered) == 1  # a private read of segment 1: no shared mapping, nothing pinned
        client.view(one, 4096)
        assert len(cuda.registered) == 2 and client.segments[1].pinned
        client.close()
        assert len(cuda.unregistered) == 2 and all(still_mapped for _a, still_mapped in cuda.unregistered)
    finally:
        owner.close()


def test_a_pinned_queue_through_a_broker(broker: BrokerProcess, no_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plumbing with a fake CUDA: ``Queue(pin_memory=True)`` pins the arena at its open (before any put), and a
    read for a CUDA device (here "cpu" stands for one) reads the shared mapping and waits for the copies once."""
    path = default_path(broker.storage)
    cuda = FakeCudart([path])
    waited: list[Any] = []
    monkeypatch.setattr(pinning, "_cudart", lambda: cuda)
    monkeypatch.setattr(pinning, "check_cuda", lambda source: None)
    monkeypatch.setattr(pinning, "is_cuda", lambda device: device == "cpu")
    monkeypatch.setattr(pinning, "wait", waited.append)
    torch = pytest.importorskip("torch")

    async def main() -> None:
        async with Queue("pinned", broker=broker.address, pin_memory=True) as q:
            assert len(cuda.registered) == 1  # at the open: segment 0, before any put
            x = torch.arange(64 * 256, dtype=torch.float32).reshape(64, 256)
            meta = await q.put({"x": x, "n": list(range(64))}, partition_id="p")
            got = await q.get_data(meta, device="cpu")
            assert torch.equal(got["x"], x) and got["n"] == list(range(64))
            assert waited == ["cpu"]
            shared = q._handle.opened.arena._mapped  # type: ignore[union-attr]
            assert shared.contains(got["x"].data_ptr())  # read from the pinned shared mapping, not a private one
            got = await q.get_data(meta)  # no device: the private copy-on-write views, as without pinning
            assert not shared.contains(got["x"].data_ptr()) and waited == ["cpu"]
        assert len(cuda.registered) == 1

    asyncio.run(main())
    arena = arena_mod._attached.pop(next(k for k in arena_mod._attached if k[0] == str(path)))
    arena.close()  # the process's mapping (kept after the Queue's close): unpinned, then unmapped
    assert [a for a, _still in cuda.unregistered] == [cuda.registered[0][0]] and cuda.unregistered[0][1]
