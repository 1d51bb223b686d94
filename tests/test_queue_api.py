"""The embedded Queue API end to end, on real Lance datasets in a temp folder."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from persisting import ConfigError, Queue, QueueClosedError, SyncQueue


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_put_get_flush_stats(store: Path) -> None:
    async def main() -> None:
        async with Queue("rollouts", storage_path=store) as q:
            await q.put({"id": 1, "prompt": "2+2", "score": 0.5})
            await q.put_batch([{"id": i, "text": f"t{i}"} for i in range(1000)])
            assert len(q) == 1001
            rows = await q.get(limit=3, offset=0)
            assert rows == [{"id": 1, "prompt": "2+2", "score": 0.5}, {"id": 0, "text": "t0"}, {"id": 1, "text": "t1"}]
            await q.flush()
            st = await q.stats()
            assert st["total_count"] == 1001 and st["flushed"] == 1001 and st["buffered"] == 0
            assert sum(b["total_count"] for b in st["buckets"]) == 1001
            assert st["fields"] == {"id": "int", "prompt": "str", "score": "float", "text": "str"}
            # offsets are global indexes; results come back in index order across buckets
            rows = await q.get(limit=5, offset=500)
            assert [r["id"] for r in rows] == [499, 500, 501, 502, 503]
            assert await q.get(limit=10, offset=1001) == []
            assert len(await q.get(limit=10, offset=995)) == 6

    run(main())


def test_reads_mix_flushed_and_buffered_rows(store: Path) -> None:
    async def main() -> None:
        async with Queue("mix", storage_path=store, batch_size=10_000) as q:
            await q.put_batch([{"id": i} for i in range(50)])
            await q.flush()
            await q.put_batch([{"id": i} for i in range(50, 80)])
            st = await q.stats()
            assert st["flushed"] == 50 and st["buffered"] == 30
            assert [r["id"] for r in await q.get(limit=100, offset=40)] == list(range(40, 80))

    run(main())


def test_reopen_sees_everything_and_continues_indexes(store: Path) -> None:
    async def first() -> None:
        q = Queue("topic", storage_path=store, batch_size=7)
        await q.put_batch([{"id": i, "v": i * 2} for i in range(20)])
        await q.flush()
        await q.put_batch([{"id": i, "v": i * 2} for i in range(20, 25)])  # left unflushed in the log
        await q.aclose()

    async def second() -> None:
        async with Queue("topic", storage_path=store, batch_size=7) as q:
            assert len(q) == 25
            await q.put({"id": 25, "v": 50})
            rows = await q.get(limit=100)
            assert [r["id"] for r in rows] == list(range(26))
            assert all(r["v"] == r["id"] * 2 for r in rows)

    run(first())
    run(second())


def test_auto_flush_by_batch_size_and_interval(store: Path) -> None:
    async def main() -> None:
        async with Queue("auto", storage_path=store, batch_size=10) as q:
            await q.put_batch([{"id": i} for i in range(25)])
            for _ in range(200):
                if (await q.stats())["flushed"] == 25:
                    break
                await asyncio.sleep(0.01)
            assert (await q.stats())["flushed"] == 25
        async with Queue("timer", storage_path=store, batch_size=10**6, auto_flush_interval_sec=0.05) as q:
            await q.put({"id": 1})
            for _ in range(200):
                if (await q.stats())["flushed"] == 1:
                    break
                await asyncio.sleep(0.01)
            assert (await q.stats())["flushed"] == 1

    run(main())


def test_stream_without_wait_stops_at_end(store: Path) -> None:
    async def main() -> None:
        async with Queue("s", storage_path=store, batch_size=100) as q:
            await q.put_batch([{"id": i} for i in range(250)])
            chunks = [c async for c in q.stream(limit=1000, offset=10)]
            assert [len(c) for c in chunks] == [100, 100, 40]
            assert [r["id"] for c in chunks for r in c] == list(range(10, 250))
            limited = [c async for c in q.stream(limit=150, offset=0)]
            assert sum(map(len, limited)) == 150

    run(main())


def test_stream_wait_times_out_and_wakes_on_put(store: Path) -> None:
    async def main() -> None:
        async with Queue("w", storage_path=store) as q:
            t0 = time.monotonic()
            assert [c async for c in q.stream(limit=10, offset=0, wait=True, timeout=0.2)] == []
            assert 0.15 <= time.monotonic() - t0 < 2.0

            async def producer() -> None:
                for i in range(5):
                    await asyncio.sleep(0.05)
                    await q.put({"id": i})

            task = asyncio.create_task(producer())
            got = []
            async for chunk in q.stream(limit=5, offset=0, wait=True, timeout=5):
                got.extend(r["id"] for r in chunk)
            await task
            assert got == [0, 1, 2, 3, 4]

    run(main())


def test_stream_wait_wakes_for_a_put_from_another_thread(store: Path) -> None:
    with SyncQueue("x", storage_path=store) as sq:
        done = threading.Event()
        got: list[int] = []

        def consume() -> None:
            for chunk in sq.stream(limit=3, wait=True, timeout=10):
                got.extend(r["id"] for r in chunk)
            done.set()

        t = threading.Thread(target=consume)
        t.start()
        for i in range(3):
            time.sleep(0.05)
            sq.put({"id": i})
        assert done.wait(10)
        t.join()
        assert got == [0, 1, 2]


def test_sync_and_async_twins_share_files(store: Path) -> None:
    with SyncQueue("shared", storage_path=store) as sq:
        sq.put_batch([{"id": i} for i in range(10)])
        assert len(sq) == 10

    async def read() -> list[int]:
        async with Queue("shared", storage_path=store) as q:
            await q.put({"id": 10})
            return [r["id"] for r in await q.get(100)]

    assert run(read()) == list(range(11))
    with SyncQueue("shared", storage_path=store) as sq:
        assert [r["id"] for r in sq.get(100, 5)] == list(range(5, 11))
        assert sum(len(c) for c in sq.stream(limit=100)) == 11
        assert sq.stats()["total_count"] == 11


def test_sync_queue_is_thread_safe(store: Path) -> None:
    with SyncQueue("threads", storage_path=store, batch_size=50) as sq:

        def worker(w: int) -> None:
            for i in range(40):
                sq.put({"id": w * 1000 + i, "w": w})

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows = sq.get(10_000)
        assert len(rows) == 320 == len(sq)
        assert sorted(r["id"] for r in rows) == sorted(w * 1000 + i for w in range(8) for i in range(40))
        for w in range(8):  # each thread's puts stay in its order
            ids = [r["id"] for r in rows if r["w"] == w]
            assert ids == sorted(ids)


def test_many_concurrent_coroutines_get_unique_indexes(store: Path) -> None:
    async def main() -> None:
        async with Queue("conc", storage_path=store, batch_size=64) as q:

            async def one(c: int) -> None:
                for i in range(20):
                    await q.put_batch([{"id": c * 100 + i, "c": c, "i": i}])

            await asyncio.gather(*(one(c) for c in range(50)))
            rows = await q.get(limit=10_000)
            assert len(rows) == 1000 == len(q)
            assert len({r["id"] for r in rows}) == 1000
            for c in range(50):
                assert [r["i"] for r in rows if r["c"] == c] == list(range(20))
            st = await q.stats()
            assert st["next_index"] == 1000

    run(main())


def test_two_queue_objects_one_topic_share_the_engine(store: Path) -> None:
    async def main() -> None:
        a = Queue("same", storage_path=store)
        b = Queue("same", storage_path=store)
        await a.put({"id": 1})
        await b.put({"id": 2})
        assert len(a) == len(b) == 2
        await a.aclose()
        assert len(await b.get()) == 2  # b keeps the engine open
        await b.aclose()
        with pytest.raises(QueueClosedError):
            await b.put({"id": 3})

    run(main())


def test_topics_never_collide(store: Path) -> None:
    names = ["a/b", "a%2Fb", "a_b", "a.b", "A B", "ünï", ".", ".."]

    async def main() -> None:
        for n, name in enumerate(names):
            async with Queue(name, storage_path=store) as q:
                await q.put({"id": n, "name": name})
        for n, name in enumerate(names):
            async with Queue(name, storage_path=store) as q:
                assert await q.get() == [{"id": n, "name": name}]
        assert len({p.name for p in store.iterdir()}) == len(names)
        assert all(p.parent == store for p in store.iterdir())

    run(main())


def test_stored_config_is_enforced(store: Path) -> None:
    async def main() -> None:
        async with Queue("cfg", storage_path=store, num_buckets=3) as q:
            await q.put({"id": 1})
        with pytest.raises(ConfigError, match="num_buckets=3"):
            async with Queue("cfg", storage_path=store, num_buckets=4):
                pass
        async with Queue("cfg", storage_path=store, num_buckets=3) as q:
            assert len(q) == 1

    run(main())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_buckets": 0},
        {"batch_size": 0},
        {"auto_flush_interval_sec": -1},
        {"zerocopy_mode": "sometimes"},
        {"durability": "maybe"},
        {"bucket_column": ""},
        {"backend": object()},
    ],
)
def test_bad_config_is_refused(store: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Queue("bad", storage_path=store, **kwargs)  # type: ignore[arg-type]


def test_bad_read_arguments(store: Path) -> None:
    async def main() -> None:
        async with Queue("args", storage_path=store) as q:
            for limit, offset in [(-1, 0), (1, -5), ("3", 0), (1.5, 0)]:
                with pytest.raises(ConfigError):
                    await q.get(limit, offset)  # type: ignore[arg-type]

    run(main())


def test_metrics(store: Path) -> None:
    async def main() -> None:
        async with Queue("m", storage_path=store, enable_metrics=True) as q:
            await q.put_batch([{"id": i} for i in range(10)])
            await q.flush()
            await q.get(5)
            m = (await q.stats())["metrics"]
            assert m["puts"] == 1 and m["records_put"] == 10 and m["flushes"] == 1 and m["records_read"] == 5
            assert "metrics" in (await q.stats())["buckets"][0]

    run(main())


def test_records_without_bucket_column_are_spread(store: Path) -> None:
    async def main() -> None:
        async with Queue("nobucket", storage_path=store, num_buckets=4) as q:
            await q.put_batch([{"x": i} for i in range(40)])
            await q.flush()
            counts = [b["total_count"] for b in (await q.stats())["buckets"]]
            assert counts == [10, 10, 10, 10]
            assert [r["x"] for r in await q.get(100)] == list(range(40))

    run(main())


def test_flush_cost_does_not_rewrite_stored_data(store: Path) -> None:
    """Each flush appends one fragment per bucket; earlier data files are never rewritten by a flush."""

    async def main() -> None:
        async with Queue("append-only", storage_path=store, num_buckets=1, batch_size=10**6) as q:
            await q.put_batch([{"id": i} for i in range(1000)])
            await q.flush()
            files_before = set((store / "append-only" / "bucket-0.lance" / "data").iterdir())
            await q.put_batch([{"id": i} for i in range(1000, 1010)])
            await q.flush()
            files_after = set((store / "append-only" / "bucket-0.lance" / "data").iterdir())
            assert files_before < files_after and len(files_after - files_before) == 1

    run(main())


def test_error_hierarchy() -> None:
    import queue

    import persisting
    from persisting import errors

    assert issubclass(persisting.Empty, queue.Empty) and issubclass(persisting.Full, queue.Full)
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), persisting.PersistingError)
    assert issubclass(persisting.InvalidRecordError, TypeError)
    assert issubclass(persisting.ConfigError, ValueError)
    assert issubclass(persisting.StorageError, OSError)
