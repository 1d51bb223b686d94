from __future__ import annotations

import os
import random
from pathlib import Path

import pytest


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A random seed, printed so a failure can be replayed with PERSISTING_TEST_SEED=<n>."""
    value = int(os.environ.get("PERSISTING_TEST_SEED", random.randrange(2**32)))
    print(f"\n[{request.node.name}] seed={value} (replay with PERSISTING_TEST_SEED={value})")
    return value


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "data"
