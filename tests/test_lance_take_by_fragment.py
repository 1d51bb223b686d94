"""``lance_dense.take_by_fragment`` takes the rows ``LanceDataset.take`` takes, fragment by fragment: the same
rows in the same order on a real dataset of several fragments with deleted rows, before and after a delete
moves positions (the fragment map is made per dataset version), and clear errors for positions out of range."""

from __future__ import annotations

import random
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from persisting.storage.lance_dense import take_by_fragment


def _dataset(path: Path, rng: np.random.Generator) -> lance.LanceDataset:
    n = 200
    values = rng.random((n, 8), dtype=np.float32)
    table = pa.table(
        {
            "i": pa.array(np.arange(n)),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 8),
        }
    )
    return lance.write_dataset(table, str(path), max_rows_per_file=23, data_storage_version="2.2")


def _same(ds: lance.LanceDataset, positions: np.ndarray) -> None:
    want = ds.take(positions, columns=["i", "x"])
    got = take_by_fragment(ds, positions, ["i", "x"])
    assert got.column("i").to_pylist() == want.column("i").to_pylist()
    assert got.column("x").to_pylist() == want.column("x").to_pylist()


def test_same_rows_as_dataset_take_across_fragments_and_deletes(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    ds = _dataset(tmp_path / "d", rng)
    assert len(ds.get_fragments()) > 5
    for _ in range(3):
        live = ds.count_rows()
        for size in (1, 2, 17, live):
            _same(ds, np.sort(rng.choice(live, size, replace=False)))
        _same(ds, np.arange(live)[5:60])  # a run crossing fragments
        _same(ds, rng.permutation(live)[:9])  # not ascending: ds.take's own order
        gone = ", ".join(str(int(i)) for i in rng.choice(ds.to_table(columns=["i"]).column("i"), 15, replace=False))
        # positions after them move down; the same object moves on to a new version: a new fragment map
        ds.delete(f"i IN ({gone})")


def test_positions_out_of_range_raise(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d", np.random.default_rng(0))
    with pytest.raises(ValueError, match="outside the 200 rows"):
        take_by_fragment(ds, np.array([3, 200]), ["x"])
