"""The broker sizes a get_batch's data from ``Topic.describe``'s runs (``pieces.described_bytes``), without a meta
per sample: it must give what sizing the meta gives (``sample_bytes(meta_from(...))``), for every kind of field."""

from __future__ import annotations

import random

import pytest

from persisting.errors import ProtocolError
from persisting.tensors import batches, pieces

KINDS = [
    ("ndarray", "int64", [1024]),
    ("tensor", "float32", [4, 7]),
    ("tensor", "bfloat16", [3]),
    ("ndarray", "bool", []),
    ("value", "", []),
    ("jagged", "float32", [-1]),
    ("ndarray", "", [5]),  # dtype unknown
]


def _described(rng: random.Random, names: list[str]) -> list[list[object]]:
    runs: list[list[object]] = []
    for _ in range(rng.randint(1, 5)):
        desc = {n: list(rng.choice(KINDS)) for n in names if rng.random() < 0.8}
        run: list[object] = [rng.randint(1, 40), desc]
        if rng.random() < 0.3:
            run.append({"tag": 1})
        runs.append(run)
    return runs


def test_described_bytes_matches_the_per_sample_meta() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    names = ["a", "b", "c", "d"]
    for _ in range(300):
        described = _described(rng, names)
        fields = rng.sample(names, rng.randint(0, len(names))) + (["a"] if rng.random() < 0.2 else [])
        n = sum(int(r[0]) for r in described)  # type: ignore[call-overload]
        meta = batches.meta_from(list(range(n)), "p", described, fields)
        assert pieces.described_bytes(described, fields) == sum(pieces.sample_bytes(meta, fields))


def test_too_big_checks_the_runs_cover_the_samples() -> None:
    from broker.requests import spool as spooling

    described = [[3, {"x": ["ndarray", "float32", [1 << 20]]}]]
    assert spooling.too_big([0, 1, 2], described, ["x"], 8 << 20)  # 12 MiB over what an 8 MiB arena takes
    assert not spooling.too_big([0, 1, 2], described, ["x"], 1 << 30)
    with pytest.raises(ProtocolError, match="cover 3 samples, not 4"):
        spooling.too_big([0, 1, 2, 3], described, ["x"], 1 << 30)
