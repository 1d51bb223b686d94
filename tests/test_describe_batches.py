"""get_meta's descriptions of samples in arena batches (each batch's rows described once, a take of one batch's
samples answered as one run): tags and fields patched in after a batch was first described still show in the
next takes of that batch, and a batch whose rows write different fields is described row by row."""

from __future__ import annotations

import asyncio

import numpy as np

from persisting import Queue

from .broker_fixture import BrokerProcess


def test_tags_and_patches_after_a_batch_was_described(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with Queue("described", broker=broker.address) as q:
            put = await q.put({"x": np.zeros((16, 4), np.float32), "n": list(range(16))}, partition_id="p")
            first = await q.get_meta(["x", "n"], 4, "t", "p")  # describes the batch
            assert first.global_indexes == [0, 1, 2, 3]
            assert all(
                s.fields["x"].shape == (4,) and np.dtype(s.fields["x"].dtype) == np.float32 for s in first.samples
            )
            await q.set_custom_meta(put.select_samples([5]).with_custom_meta({5: {"score": 1.5}}))
            await q.put({"y": np.ones((1, 2), np.float32)}, partition_id="p", batch_meta=put.select_samples([6]))
            second = await q.get_meta(["x", "n"], 4, "t", "p")
            assert second.global_indexes == [4, 5, 6, 7]
            assert [s.custom_meta for s in second.samples] == [{}, {"score": 1.5}, {}, {}]
            ready = await q.check_ready(second, ["x", "y"])
            assert [s.fields["y"].is_ready for s in ready.samples] == [False, False, True, False]
            assert ready.samples[2].fields["y"].shape == (2,)
            assert all(s.fields["x"].shape == (4,) for s in ready.samples)
            third = await q.get_meta(["x", "n"], 4, "t", "p")  # the same batch, untouched samples
            assert third.global_indexes == [8, 9, 10, 11]
            assert all(s.fields["n"].kind == "int" and s.custom_meta == {} for s in third.samples)
            assert not any(s.fields["y"].is_ready for s in (await q.check_ready(third, ["y"])).samples)

    asyncio.run(main())


def test_rows_of_one_batch_that_write_different_fields(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with Queue("mixed", broker=broker.address) as q:
            await q.put({"x": np.zeros((4, 2), np.float32), "note": ["a", None, "c", None]}, partition_id="p")
            meta = await q.get_meta(None, 4, "t", "p")  # every sample, with the fields it has
            assert meta.global_indexes == [0, 1, 2, 3]
            assert [sorted(s.fields) for s in meta.samples] == [["note", "x"], ["x"], ["note", "x"], ["x"]]

    asyncio.run(main())
