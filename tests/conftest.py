from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from persisting.client.connection import Connection

from .broker_fixture import BrokerProcess, make_broker, running_broker


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A random seed, printed so a failure can be replayed with PERSISTING_TEST_SEED=<n>."""
    value = int(os.environ.get("PERSISTING_TEST_SEED", random.randrange(2**32)))
    print(f"\n[{request.node.name}] seed={value} (replay with PERSISTING_TEST_SEED={value})")
    return value


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def broker_args() -> list[str]:
    """Extra command-line arguments of the ``broker`` fixture's broker (a module overrides this fixture)."""
    return []


@pytest.fixture
def broker(tmp_path: Path, broker_args: list[str]) -> Iterator[BrokerProcess]:
    """A real broker subprocess on fresh storage, started; stopped cleanly (exit 0) if the test left it running."""
    with running_broker(tmp_path, broker_args) as b:
        yield b


@pytest.fixture
def arena_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """A real broker whose arena is the test module's ``ARENA_BYTES`` (a small arena fills in a few puts)."""
    with running_broker(tmp_path, ["--arena-bytes", str(request.module.ARENA_BYTES)]) as b:
        yield b


@pytest.fixture
def logged_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A real broker with a 4 MiB arena whose stderr goes to ``tmp_path/broker.log`` (tests that read its log)."""
    b = make_broker(tmp_path)
    b.extra_args = ["--arena-bytes", str(4 * 1024 * 1024)]
    b.log_path = tmp_path / "broker.log"
    try:
        b.start()
        yield b
    finally:
        b.ensure_dead()


@pytest.fixture(params=["embedded", "broker"])
def arena_queue_kw(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """``Queue`` arguments of each mode: embedded on fresh storage, or the test module's ``arena_broker``."""
    if request.param == "embedded":
        return {"storage_path": str(tmp_path / "store")}
    broker: BrokerProcess = request.getfixturevalue("arena_broker")
    return {"broker": broker.address}


@pytest.fixture
def ops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The operations this process sends to a broker, in order (the real requests still go)."""
    sent: list[str] = []
    real = Connection.request

    async def request(self: Connection, op: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(op)
        return await real(self, op, *args, **kwargs)

    monkeypatch.setattr(Connection, "request", request)
    return sent
