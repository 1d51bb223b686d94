"""The write-ahead log replays what it acknowledged, whatever a frame's size."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest

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


def _frames(wal: WriteAheadLog, first: int, n: int) -> None:
    for i in range(first, first + n):
        wal.append(i, 1, ["p", {"n": "int"}, None], msgpack.packb([{"n": i}]))


def test_sync_appends_do_not_grow_the_segment_file(tmp_path: Path) -> None:
    """Frames go into room allocated ahead, so an fdatasync has no new file size to commit (a cheaper sync)."""

    async def write() -> list[int]:
        wal = WriteAheadLog(tmp_path / "wal", sync=True)
        wal.rotate(0)
        sizes = []
        for i in range(50):
            _frames(wal, i, 1)
            await wal.commit()
            sizes.append((tmp_path / "wal" / "00000000000000000000.log").stat().st_size)
        await wal.close()
        return sizes

    sizes = asyncio.run(write())
    assert len(set(sizes)) == 1, f"the segment file grew with the frames: {sizes[:5]}..."
    closed = (tmp_path / "wal" / "00000000000000000000.log").stat().st_size
    assert closed < sizes[0]  # a closed log keeps no unused room
    assert [f.first_index for f in WriteAheadLog(tmp_path / "wal", sync=True).replay()] == list(range(50))


def test_unused_room_left_by_a_kill_is_no_torn_frame(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A process killed before it trimmed its segments leaves zeros after their last frames (in a rotated-out
    segment too): replay keeps every frame of every segment, and warns of nothing."""
    folder = tmp_path / "wal"

    async def write_and_die() -> None:
        wal = WriteAheadLog(folder, sync=True)
        wal.rotate(0)
        _frames(wal, 0, 5)
        await wal.commit()
        room = folder / "00000000000000000000.log"
        wal.rotate(5)
        _frames(wal, 5, 5)
        await wal.commit()
        # A kill -9 right after the rotation: the old segment still holds its room (the trim never landed).
        with open(room, "r+b") as f:
            f.seek(0, 2)
            f.write(bytes(4096))

    asyncio.run(write_and_die())
    with_room = sum(p.stat().st_size for p in folder.iterdir())
    frames = list(WriteAheadLog(folder, sync=True).replay())
    assert [f.first_index for f in frames] == list(range(10))
    assert sum(p.stat().st_size for p in folder.iterdir()) < with_room  # the zeros are cut off
    assert "torn" not in caplog.text


def test_small_and_large_frames_mixed_replay_intact(tmp_path: Path) -> None:
    """Frames larger than the room allocated ahead grow the file themselves; the room made after them never
    covers a frame (every frame replays with its bytes)."""
    big = bytes(range(256)) * (3 * 1024 * 1024 // 256)

    async def write() -> None:
        wal = WriteAheadLog(tmp_path / "wal", sync=True)
        wal.rotate(0)
        _frames(wal, 0, 3)
        wal.append(3, 1, ["p", {"blob": "bytes"}, None], msgpack.packb([{"blob": big}]))
        _frames(wal, 4, 3)
        wal.append(7, 1, ["p", {"blob": "bytes"}, None], msgpack.packb([{"blob": big[:1000]}]))
        _frames(wal, 8, 2)
        await wal.commit()  # no close: a kill leaves the room in place

    asyncio.run(write())
    frames = list(WriteAheadLog(tmp_path / "wal", sync=True).replay())
    assert [f.first_index for f in frames] == list(range(10))
    assert frames[3].rows() == [{"blob": big}] and frames[7].rows() == [{"blob": big[:1000]}]
    assert [frames[i].rows() for i in (0, 6, 9)] == [[{"n": 0}], [{"n": 6}], [{"n": 9}]]


def test_a_commit_returns_after_its_fdatasync_on_the_logs_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loop (the broker, embedded mode's engine loop) a round's fdatasync runs on the log's own thread, and a
    commit returns only once a sync that began after its frame was written has finished; concurrent commits share
    rounds. The thread ends at close."""
    import os
    import threading

    real = os.fdatasync
    synced: list[tuple[str, int]] = []  # (thread name, frames written when the sync began)

    async def run() -> None:
        wal = WriteAheadLog(tmp_path / "wal", sync=True)
        wal.rotate(0)

        def recording(fd: int) -> None:
            written = wal._written_seq
            real(fd)
            synced.append((threading.current_thread().name, written))

        monkeypatch.setattr(os, "fdatasync", recording)

        async def put(i: int) -> None:
            _frames(wal, i, 1)
            mine = wal._written_seq
            await wal.commit()
            assert any(written >= mine for _, written in synced), f"commit of frame {mine} returned before its sync"

        await asyncio.gather(*(put(i) for i in range(50)))
        await wal.close()
        monkeypatch.setattr(os, "fdatasync", real)

    asyncio.run(run())
    assert synced and all(name.startswith("wal-sync") for name, _ in synced[:-1]), synced[:3]
    assert len(synced) < 50, "concurrent commits should share rounds"
    mine = f"wal-sync {tmp_path.name}"
    assert not [t for t in threading.enumerate() if t.name == mine], "the sync thread outlived close"
    assert [f.first_index for f in WriteAheadLog(tmp_path / "wal", sync=True).replay()] == list(range(50))


def test_a_failed_fdatasync_fails_the_commit_and_every_later_write(tmp_path: Path) -> None:
    """A round whose fdatasync fails (here: the segment's descriptor closed under it, EBADF) raises StorageError
    in the waiting commit, and the log refuses further writes (the page cache state is unknown after a failed
    sync)."""
    import os

    from persisting.errors import StorageError

    async def run() -> None:
        wal = WriteAheadLog(tmp_path / "wal", sync=True)
        wal.rotate(0)
        _frames(wal, 0, 1)
        assert wal._current is not None
        os.close(wal._current.fd)
        with pytest.raises(StorageError, match="fdatasync"):
            await wal.commit()
        with pytest.raises(StorageError, match="failed earlier"):
            _frames(wal, 1, 1)
        wal._current.fd = os.open(os.devnull, os.O_RDONLY)  # so that close has a descriptor to close
        await wal.close()

    asyncio.run(run())


def test_a_commit_up_to_a_frame_syncs_only_when_a_frame_before_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``commit(upto)``, what a put that need not be durable waits for (puts.py): no round when the frames before
    it are synced, a round when one of them still waits for its fdatasync."""
    import os

    real = os.fdatasync
    calls: list[int] = []

    def recording(fd: int) -> None:
        real(fd)
        calls.append(fd)

    async def run() -> None:
        wal = WriteAheadLog(tmp_path / "wal", sync=True)
        wal.rotate(0)
        monkeypatch.setattr(os, "fdatasync", recording)
        _frames(wal, 0, 1)
        await wal.commit()
        synced = len(calls)
        assert synced >= 1
        upto = wal.written
        _frames(wal, 1, 1)  # a frame that need not be durable, after synced ones
        await wal.commit(upto)
        assert len(calls) == synced
        _frames(wal, 2, 1)  # a durable frame, not synced yet
        upto = wal.written
        _frames(wal, 3, 1)
        await wal.commit(upto)
        assert len(calls) > synced
        await wal.close()
        monkeypatch.setattr(os, "fdatasync", real)

    asyncio.run(run())
    assert [f.first_index for f in WriteAheadLog(tmp_path / "wal", sync=True).replay()] == [0, 1, 2, 3]


def test_a_put_that_need_not_be_durable_waits_for_no_fdatasync_and_is_readable_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from persisting import Queue
    from persisting.compat import _engine

    real = os.fdatasync
    calls: list[int] = []

    def recording(fd: int) -> None:
        real(fd)
        calls.append(fd)

    async def run() -> None:
        q = Queue("t", str(tmp_path), durability="sync")
        await q.put_batch([{"n": 0}], partition_id="p")
        monkeypatch.setattr(os, "fdatasync", recording)
        assert list(await _engine.put_records(q, "p", [{"n": 1}], durable=False)) == [1]
        assert calls == []
        assert [r["n"] for r in await q.get(10, 0)] == [0, 1]
        await q.put_batch([{"n": 2}], partition_id="p")  # its fdatasync covers the frame before it too
        assert calls
        monkeypatch.setattr(os, "fdatasync", real)
        await q.aclose()
        q = Queue("t", str(tmp_path), durability="sync")
        assert [r["n"] for r in await q.get(10, 0)] == [0, 1, 2]
        await q.aclose()

    asyncio.run(run())
