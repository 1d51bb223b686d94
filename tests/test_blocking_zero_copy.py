"""A blocking caller (SyncQueue through a broker, client/blocking.py) receives a big reply frame as a view of the
ZeroMQ message, as the loop's path does (zsocket.recv_viewing): the frame is copied once, into the array the
caller gets, never first into a bytes object. Measured with tracemalloc, which sees Python's and numpy's
allocations but not libzmq's message buffers: the peak of a 32 MiB read stays near one copy, not two."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import numpy as np

from persisting import Queue, SyncQueue

from .broker_fixture import running_broker

FIELD_BYTES = 32 * 1024 * 1024


def _peak_of(read: object) -> tuple[object, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        got = read()  # type: ignore[operator]
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_blocking_read_of_a_big_field_copies_it_once(tmp_path: Path) -> None:
    rows = 8
    x = np.arange(rows * FIELD_BYTES // 4 // rows, dtype=np.float32).reshape(rows, -1) + np.arange(rows)[:, None]
    with running_broker(tmp_path, ["--arena-bytes", "0"]) as b:  # no arena: the data travels in reply frames
        with SyncQueue("z", broker=b.address) as q:
            meta = q.put({"x": x}, partition_id="p")
            q.flush()
            got, peak = _peak_of(lambda: q.get_data(meta))
            np.testing.assert_array_equal(got["x"], x)  # type: ignore[index]
            # one copy (the array) plus small change; a bytes copy of the frame first would double it
            assert peak < 1.5 * FIELD_BYTES, f"peak {peak / 2**20:.1f} MiB for a {FIELD_BYTES / 2**20:.0f} MiB read"

        async def loop_read() -> int:  # the loop's path, the reference the blocking path must match
            async with Queue("z", broker=b.address) as aq:
                tracemalloc.start()
                try:
                    tracemalloc.reset_peak()
                    data = await aq.get_data(meta)
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                np.testing.assert_array_equal(data["x"], x)
                return peak

        assert asyncio.run(loop_read()) < 1.5 * FIELD_BYTES
