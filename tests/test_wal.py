"""The write-ahead log replays what it acknowledged, whatever a frame's size."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack

from persisting.engine.wal import WriteAheadLog

BIG_FRAME_BYTES = 101 * 1024 * 1024  # past msgpack's default buffer limit (100 MiB)


def test_a_frame_larger_than_msgpacks_default_buffer_replays(tmp_path: Path) -> None:
    """A put_batch of more than 100 MiB was acknowledged but its topic could not reopen (BufferFull at replay)."""
    payload = bytes(range(256)) * (BIG_FRAME_BYTES // 256)
    rows_blob = msgpack.packb([{"blob": payload}, {"n": 2}])

    async def write() -> None:
        wal = WriteAheadLog(tmp_path / "wal", sync=False)
        wal.rotate(0)
        wal.append(0, 2, ["p", {"blob": "bytes", "n": "int"}, None], rows_blob)
        wal.append(2, 1, ["p", {}, "key"], msgpack.packb([{"n": 3}]))
        await wal.commit()
        await wal.close()

    asyncio.run(write())
    frames = list(WriteAheadLog(tmp_path / "wal", sync=False).replay())
    assert [(f.first_index, f.count, f.header[0]) for f in frames] == [(0, 2, "p"), (2, 1, "p")]
    rows = frames[0].rows()
    assert rows[0]["blob"] == payload and rows[1] == {"n": 2}
    assert frames[1].rows() == [{"n": 3}] and frames[1].header[2] == "key"
