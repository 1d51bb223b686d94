"""The workload of ``python -m bench lance-encoding``: what Lance's encoder costs per GB of a dense tensor column, by
file format (``data_storage_version``), field metadata and Arrow layout, and whether each format keeps the typed
storage (``persisting/storage/tensor_columns.py``: null variable-shape tensors are null structs, all-null columns are
added).

Each case: ``lance.write_dataset`` of ``--mib`` MiB in one column (rows of 1 MiB) to a new dataset, then fsync of its
files. CPU s/GB: this process's CPU time (Lance's threads included) per GB of payload; GB/s: payload / wall time;
``--reps`` writes each. "typed storage": a struct column with a null row written, then a column of nulls only added,
and both read back as written. Pieces: the writer's setting (fixed-shape float32, compression off, ``stable``)
appended with ``lance.fragment.write_fragments`` (what ``lance_parallel`` does) in pieces of 16, 64 and 256 MiB: CPU
s/GB of the whole ``--mib``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from lance.fragment import write_fragments

MiB = 1024 * 1024
ROW_BYTES = MiB
FORMATS = ("legacy", "2.0", "2.1", "stable")
NO_COMPRESSION = {"lance-encoding:compression": "none"}
CASES: list[tuple[str, str, dict[str, str]]] = [  # (layout, dtype, field metadata)
    ("fixed_shape_tensor", "float32", {}),
    ("fixed_shape_tensor", "float32", NO_COMPRESSION),
    ("fixed_size_list", "float32", NO_COMPRESSION),
    ("large_binary", "float32", NO_COMPRESSION),
    ("fixed_shape_tensor", "bfloat16", NO_COMPRESSION),
    ("fixed_shape_tensor", "uint8", {}),
]


def _column(layout: str, dtype: str, rows: int) -> pa.Array:
    rng = np.random.default_rng(0)
    if dtype == "float32":
        a: np.ndarray = rng.standard_normal((rows, ROW_BYTES // 4), dtype=np.float32)
        value: pa.DataType = pa.float32()
    elif dtype == "bfloat16":  # stored as its bits (tensor_columns)
        a, value = rng.integers(0, 2**16, (rows, ROW_BYTES // 2), dtype=np.uint16), pa.uint16()
    else:
        a, value = rng.integers(0, 256, (rows, ROW_BYTES), dtype=np.uint8), pa.uint8()
    if layout == "large_binary":
        offsets = pa.py_buffer(np.arange(rows + 1, dtype=np.int64) * ROW_BYTES)
        return pa.Array.from_buffers(pa.large_binary(), rows, [None, offsets, pa.py_buffer(a)])
    fsl = pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1), type=value), a.shape[1])
    if layout == "fixed_size_list":
        return fsl
    return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(value, [a.shape[1]]), fsl)


def _sync_tree(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _write(folder: Path, fmt: str, array: pa.Array, meta: dict[str, str]) -> tuple[float, float]:
    table = pa.Table.from_arrays([array], schema=pa.schema([pa.field("x", array.type, metadata=meta or None)]))
    path = folder / "ds.lance"
    shutil.rmtree(path, ignore_errors=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    ds = lance.write_dataset(table, str(path), data_storage_version=fmt)  # type: ignore[arg-type]
    _sync_tree(path)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    if ds.to_table().column("x").type != array.type:
        raise RuntimeError(f"{fmt}: the column came back as {ds.to_table().column('x').type}")
    return cpu / (table.nbytes / 1e9), table.nbytes / wall / 1e9


def _typed_storage(folder: Path, fmt: str) -> str:
    """Whether ``fmt`` keeps what the typed layouts need, or what breaks."""
    shape = pa.struct([("data", pa.large_list(pa.float32())), ("shape", pa.list_(pa.int32()))])
    rows = pa.array([{"data": [1.0, 2.0], "shape": [2]}, None], type=shape)
    path = folder / "typed.lance"
    shutil.rmtree(path, ignore_errors=True)
    try:
        ds = lance.write_dataset(pa.table({"x": rows}), str(path), data_storage_version=fmt)  # type: ignore[arg-type]
        if ds.to_table().column("x").to_pylist() != rows.to_pylist():
            return "no: a null struct reads back as " + repr(ds.to_table().column("x").to_pylist()[1])
        ds.add_columns(pa.field("y", pa.float32()))  # a field first seen as nulls only
    except (OSError, ValueError) as exc:
        return "no: " + str(exc).split(",")[0][:90]
    return "yes"


PIECES_MIB = (16, 64, 256)


def _pieces(folder: Path, rows: int, reps: int) -> list[dict[str, Any]]:
    """CPU s/GB of appending the writer's column as fragments of each size in ``PIECES_MIB`` (alternating)."""
    array = _column("fixed_shape_tensor", "float32", rows)
    table = pa.Table.from_arrays([array], schema=pa.schema([pa.field("x", array.type, metadata=NO_COMPRESSION)]))
    path = folder / "pieces.lance"
    shutil.rmtree(path, ignore_errors=True)
    ds = lance.write_dataset(table.slice(0, 1), str(path))
    runs: dict[int, list[float]] = {}
    for _ in range(reps):
        for mib in PIECES_MIB:
            step = max(1, mib * MiB // ROW_BYTES)
            cpu0 = time.process_time()
            for start in range(0, rows, step):
                write_fragments(table.slice(start, step), ds)
            runs.setdefault(mib, []).append((time.process_time() - cpu0) / (table.nbytes / 1e9))
    return [{"piece_mib": mib, "cpu": r} for mib, r in runs.items()]


def run(mib: int, reps: int, folder: Path) -> list[dict[str, Any]]:
    rows = max(1, mib * MiB // ROW_BYTES)
    out: list[dict[str, Any]] = []
    for layout, dtype, meta in CASES:
        array = _column(layout, dtype, rows)
        for fmt in FORMATS:
            runs = [_write(folder, fmt, array, meta) for _ in range(reps)]
            out.append({"layout": layout, "dtype": dtype, "meta": meta, "format": fmt, "runs": runs})
    for fmt in FORMATS:
        out.append({"format": fmt, "typed_storage": _typed_storage(folder, fmt)})
    return out + _pieces(folder, rows, reps)
