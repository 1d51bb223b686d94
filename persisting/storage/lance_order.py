"""Row order of a bucket: whether its ``_persisting_index`` column increases, and a repair when it does not.

Stand-in until the engine's own module lands (the same two functions): ``disorder`` says what is wrong in one
line, ``repair`` rewrites the bucket in index order in one overwrite commit (a kill leaves the old or the new
version) and refuses (``CorruptionError``) where the order cannot be told: duplicate or missing indexes.
"""

from __future__ import annotations

from collections.abc import Iterator

import lance
import numpy as np
import pyarrow as pa

from ..errors import CorruptionError
from ..wire.codec import INDEX_KEY

REWRITE_CHUNK_ROWS = 65_536  # rows taken per step of the rewrite


def _indexes(ds: lance.LanceDataset) -> tuple[np.ndarray, int]:
    """The index column in position order (nulls as -1) and how many nulls it holds."""
    column = ds.to_table(columns=[INDEX_KEY]).column(0)
    return column.fill_null(-1).to_numpy().astype(np.int64, copy=False), column.null_count


def disorder(ds: lance.LanceDataset) -> str | None:
    """None when the index column strictly increases in position order; else one line saying what is wrong."""
    if INDEX_KEY not in ds.schema.names:
        return None if ds.count_rows() == 0 else f"no {INDEX_KEY!r} column"
    values, nulls = _indexes(ds)
    if nulls:
        return f"{nulls} rows without {INDEX_KEY!r}"
    if bool(np.all(values[1:] > values[:-1])):
        return None
    duplicates = len(values) - len(np.unique(values))
    if duplicates:
        return f"{duplicates} duplicate {INDEX_KEY!r} values"
    return f"rows out of {INDEX_KEY!r} order across {len(ds.get_fragments())} fragments"


def repair(ds: lance.LanceDataset) -> tuple[lance.LanceDataset, str]:
    """Put the rows of ``ds`` back in index order in one commit; returns the new dataset and what was done.
    ``CorruptionError`` where the order cannot be told (duplicate or missing indexes); ``ds`` is then unchanged."""
    problem = disorder(ds)
    if problem is None:
        return ds, "in order"
    values, nulls = _indexes(ds)
    if nulls or len(np.unique(values)) != len(values):
        raise CorruptionError(f"{ds.uri}: {problem}; not repaired (which row is right cannot be told)")
    order = np.argsort(values, kind="stable")

    def batches() -> Iterator[pa.RecordBatch]:
        for k in range(0, len(order), REWRITE_CHUNK_ROWS):
            yield from ds.take(order[k : k + REWRITE_CHUNK_ROWS]).to_batches()

    fresh = lance.write_dataset(
        pa.RecordBatchReader.from_batches(ds.schema, batches()),
        ds.uri,
        schema=ds.schema,
        mode="overwrite",
        data_storage_version=ds.data_storage_version,  # type: ignore[arg-type]
        enable_stable_row_ids=True,
    )
    return fresh, f"rewrote its {len(values)} rows in index order"
