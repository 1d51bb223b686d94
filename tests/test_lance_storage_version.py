"""Which Lance file format a topic's buckets are written in: a new topic in the one ``PERSISTING_LANCE_STORAGE_VERSION``
names (Lance's default without it), an existing topic in the one it was created with."""

from __future__ import annotations

import asyncio
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

from persisting import Queue
from persisting.errors import ConfigError
from persisting.queue import lance_parallel


def _versions(store: Path) -> set[str]:
    return {lance.dataset(str(b)).data_storage_version for b in (store / "t").glob("bucket-*.lance")}


def _column(store: Path) -> np.ndarray:
    bucket = next((store / "t").glob("bucket-*.lance"))
    table = lance.dataset(str(bucket)).to_table(columns=["x", "_persisting_index"]).sort_by("_persisting_index")
    col = table.column("x").combine_chunks()
    assert isinstance(col.type, pa.FixedShapeTensorType)  # typed, whatever the file format
    return col.to_numpy_ndarray()


async def _put_flush(store: Path, batch: np.ndarray) -> None:
    async with Queue("t", store, num_buckets=1) as q:
        await q.put({"x": batch}, partition_id="p")
        await q.flush()


def test_the_env_picks_a_new_topics_file_format_and_its_tensor_columns_stay_typed(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = np.random.default_rng(seed).standard_normal((4, 3, 5)).astype(np.float32)
    monkeypatch.setenv(lance_parallel.STORAGE_VERSION_ENV, "legacy")
    asyncio.run(_put_flush(tmp_path, batch))
    assert _versions(tmp_path) == {"0.1"}
    np.testing.assert_array_equal(_column(tmp_path), batch)


def test_a_topic_keeps_the_format_it_was_created_in_and_reads_back_every_row(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(seed)
    first, second = (rng.standard_normal((4, 3, 5)).astype(np.float32) for _ in range(2))
    monkeypatch.delenv(lance_parallel.STORAGE_VERSION_ENV, raising=False)
    asyncio.run(_put_flush(tmp_path, first))
    before = _versions(tmp_path)
    assert before and "0.1" not in before
    monkeypatch.setenv(lance_parallel.STORAGE_VERSION_ENV, "legacy")
    asyncio.run(_put_flush(tmp_path, second))  # appended under another setting, to a dataset created before
    assert _versions(tmp_path) == before
    np.testing.assert_array_equal(_column(tmp_path), np.concatenate([first, second]))


def test_an_unknown_format_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lance_parallel.STORAGE_VERSION_ENV, "3.9")
    with pytest.raises(ConfigError, match="PERSISTING_LANCE_STORAGE_VERSION must be one of"):
        lance_parallel.storage_version()
