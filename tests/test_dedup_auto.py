"""``Queue(dedup="auto")`` decides each field at its first put and keeps it; keyed puts and reads (``kv_put``,
``kv_get``) dedup and resolve like ``put``/``get_data``, jagged fields included; equal tensors pickle alike (what
lets dedup see equal ``multi_modal_inputs``). Embedded and through a real broker."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from persisting import SyncQueue
from persisting.tensors import objects

from .broker_fixture import BrokerProcess

N, GROUP = 8, 4  # samples per put, responses per prompt
ARENA_BYTES = 16 * 1024 * 1024
pytestmark = pytest.mark.slow


def _batch(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    images = torch.rand((N // GROUP, 32, 64), generator=g)  # 8 KiB each, one per prompt
    return {
        "image": images.repeat_interleave(GROUP, dim=0),  # big, repeats: deduped
        "logp": torch.rand((N, 2048), generator=g),  # big, distinct: plain
        "ids": torch.arange(N),  # small: plain
        "mm": [{"pixel_values": images[i // GROUP].clone()} for i in range(N)],  # big pickles, equal per group
        "uid": [f"u{i // GROUP}" for i in range(N)],  # small pickles: plain
    }


def _td(batch: dict[str, Any]) -> Any:
    """As verl hands it over: a TensorDict, its non-tensor columns NonTensorStacks (pickled per sample)."""
    pytest.importorskip("tensordict")
    from tensordict import NonTensorStack, TensorDict

    cols = {k: NonTensorStack(*v) if isinstance(v, list) else v for k, v in batch.items()}
    return TensorDict(cols, batch_size=[N])


def test_auto_decides_each_field_at_its_first_put_and_keeps_it(arena_queue_kw: dict[str, Any], seed: int) -> None:
    first = _batch(seed)
    image_bytes = 32 * 64 * 4
    with SyncQueue("auto", **arena_queue_kw, dedup="auto", objects="pickle", num_buckets=1) as q:
        q.put(_td(first), partition_id="p")
        moved = q.stats()["zerocopy"]
        assert moved["dedup_put_bytes"] == GROUP * moved["dedup_stored_bytes"]  # image and mm: 1 of 4 stored
        assert moved["dedup_put_bytes"] > N * image_bytes * 2  # both fields, not logp (8 KiB x 8 distinct)
        # the second put: logp repeats now, but it was decided plain at its first put and stays so
        second = _batch(seed + 1)
        second["logp"] = second["logp"][:1].repeat(N, 1)
        q.put(_td(second), partition_id="p")
        fields = q.stats()["fields"]
        assert {"image@payload", "mm@payload"} <= set(fields) and "logp@payload" not in fields
        assert "uid@payload" not in fields and "ids@payload" not in fields
        data, meta = q.get_batch(["image", "logp", "mm", "uid"], 2 * N, "t", "p")
    assert meta.size == 2 * N
    for k, put in enumerate((first, second)):
        rows = range(k * N, (k + 1) * N)
        assert all(torch.equal(data["image"][r], put["image"][j]) for j, r in enumerate(rows))
        assert all(torch.equal(data["logp"][r], put["logp"][j]) for j, r in enumerate(rows))
        assert all(torch.equal(data["mm"][r]["pixel_values"], put["mm"][j]["pixel_values"]) for j, r in enumerate(rows))
        assert [data["uid"][r] for r in rows] == put["uid"]


def test_kv_put_dedups_and_kv_get_resolves_jagged_fields_too(arena_queue_kw: dict[str, Any], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(0, 1000, (int(torch.randint(600, 900, (1,), generator=g)),), generator=g) for _ in range(2)
    ]
    samples = [prompts[i // GROUP] for i in range(N)]  # jagged, 4.8-7.2 KiB each, repeated per group
    keys = [f"k{i}" for i in range(N)]
    with SyncQueue("kv", **arena_queue_kw, dedup=["prompts"], num_buckets=1) as q:
        nt = torch.nested.as_nested_tensor(samples, layout=torch.jagged)
        q.kv_put(keys, {"prompts": nt, "ids": torch.arange(N)}, "p", tags=[{"n": i} for i in range(N)])
        moved = q.stats()["zerocopy"]
        assert moved["dedup_put_bytes"] == GROUP * moved["dedup_stored_bytes"] > 0
        data, meta = q.kv_get(keys[::-1], "p")  # in another order than put
        assert set(meta.extra_info["fields"]) == {"ids", "prompts"}  # named as put, not as their references
        assert torch.equal(data["ids"], torch.arange(N).flip(0))
        for got, i in zip(data["prompts"], range(N - 1, -1, -1), strict=True):
            assert torch.equal(got, samples[i])
        part, _ = q.kv_get(keys[:3], "p", fields=["prompts"])  # asked for by its own name
        assert all(torch.equal(got, samples[i]) for i, got in enumerate(part["prompts"]))


def test_equal_tensors_pickle_alike_and_come_back_exactly() -> None:
    a = torch.rand(64, 64)
    one, two = objects.dumps("mm", {"pv": a.clone()}), objects.dumps("mm", {"pv": a.clone()})
    assert one == two  # torch's own pickle differs: it names each storage by its address
    assert pickle.dumps({"pv": a.clone()}, protocol=5) != pickle.dumps({"pv": a.clone()}, protocol=5)
    cases = [a, torch.tensor(3.5), torch.empty(0, 3), a.t(), a[3:9], torch.rand(4).to(torch.bfloat16),
             torch.arange(6) > 2, torch.nn.Parameter(torch.rand(3)), torch.rand(3, requires_grad=True)]  # fmt: skip
    for t in cases:
        back = pickle.loads(objects.dumps("x", t).data)
        assert type(back) is type(t) and back.dtype == t.dtype and back.shape == t.shape
        assert torch.equal(back.detach(), t.detach()) and back.requires_grad == t.requires_grad
    view = torch.rand(1 << 16)[:4]
    assert len(objects.dumps("x", view).data) < 1024  # a view pickles its own bytes, not its whole storage


def test_auto_follows_what_another_process_decided(arena_broker: BrokerProcess) -> None:
    """Two producers, each with its own view of the topic: the second's small values of a field the first stored
    deduped are stored deduped too (it looks the field up first), so the field is never stored both ways."""
    big = [{"pv": torch.full((64, 64), float(i // GROUP))} for i in range(N)]  # 16 KiB pickles: deduped
    small = [{"pv": torch.full((2,), float(i))} for i in range(N)]  # tiny: alone, auto would keep them plain
    kw: dict[str, Any] = {"broker": arena_broker.address, "dedup": "auto", "objects": "pickle"}
    with SyncQueue("follow", **kw) as first, SyncQueue("follow", **kw) as second:
        second.put(_td({"ids": torch.arange(N)}), partition_id="p")  # opened, its view taken before mm existed
        first.put(_td({"mm": big, "ids": torch.arange(N)}), partition_id="p")
        second.put(_td({"mm": small, "ids": torch.arange(N)}), partition_id="p")
        assert second.stats()["zerocopy"]["dedup_put_bytes"] > 0, "the second producer followed the first"
        data, meta = first.get_batch(["mm"], 2 * N, "t", "p")
    assert meta.size == 2 * N  # both puts' samples have the field, stored one way
    values = [v["pv"] for v in data["mm"]]
    assert all(torch.equal(v, w["pv"]) for v, w in zip(values, big + small, strict=True))


def test_a_field_is_deduped_from_its_first_payload_row_on(arena_broker: BrokerProcess) -> None:
    """The window between a producer's payload put and its sample put (here held open: the samples are refused
    after the payloads were stored): another producer deciding "auto" then must see the field as deduped, not
    take the payload rows' own field for a plain one (two producers once stored ``multi_modal_inputs`` both
    ways, and a read of it by name dropped one's samples)."""
    from persisting import BatchMeta, ConfigError, SampleMeta

    big = [{"pv": torch.full((64, 64), float(i // GROUP))} for i in range(N)]
    small = [{"pv": torch.full((2,), float(i))} for i in range(N)]
    kw: dict[str, Any] = {"broker": arena_broker.address, "dedup": "auto", "objects": "pickle"}
    with SyncQueue("window", **kw) as first, SyncQueue("window", **kw) as second:
        nowhere = BatchMeta(tuple(SampleMeta(10_000 + i, "p", {}, {}) for i in range(N)))
        with pytest.raises(ConfigError, match="samples that exist"):
            first.put(_td({"mm": big}), batch_meta=nowhere)  # payload rows stored, then the patch refused
        assert "mm@payload" in first.stats()["fields"]
        second.put(_td({"mm": small, "ids": torch.arange(N)}), partition_id="p")
        assert second.stats()["zerocopy"]["dedup_put_bytes"] > 0, "the second producer saw the field deduped"
        first.put(_td({"mm": big, "ids": torch.arange(N)}), partition_id="p")
        data, meta = first.get_batch(["mm"], 2 * N, "t", "p")
    assert meta.size == 2 * N
    values = [v["pv"] for v in data["mm"]]
    assert all(torch.equal(v, w["pv"]) for v, w in zip(values, small + big, strict=True))


def test_a_put_storing_a_field_the_other_way_is_refused(arena_broker: BrokerProcess) -> None:
    """A topic stores a field one way: a Queue whose ``dedup`` names it otherwise gets ``DedupConflictError``
    naming the field and the fix, and nothing of that put is stored; "auto" follows the topic."""
    from persisting import DedupConflictError

    big = [{"pv": torch.full((64, 64), float(i // GROUP))} for i in range(N)]
    base: dict[str, Any] = {"broker": arena_broker.address, "objects": "pickle"}
    with (
        SyncQueue("ways", **base, dedup=["mm"]) as named,
        SyncQueue("ways", **base, dedup=False) as plain,
        SyncQueue("ways", **base, dedup=["other"]) as other,
        SyncQueue("ways", **base, dedup="auto") as auto,
    ):
        named.put(_td({"mm": big}), partition_id="p")
        plain.put(_td({"other": big}), partition_id="p")
        with pytest.raises(DedupConflictError, match="'mm' is stored deduped") as err:
            plain.put(_td({"mm": big}), partition_id="p")
        assert err.value.field == "mm" and err.value.deduped
        with pytest.raises(DedupConflictError, match="'other' is stored plain") as err:
            other.put(_td({"other": big}), partition_id="p")
        assert err.value.field == "other" and not err.value.deduped
        auto.put(_td({"mm": big, "other": big}), partition_id="p")
        fields = auto.stats()["fields"]
        assert "mm@payload" in fields and "other@payload" not in fields
        data, meta = auto.get_batch(["mm"], 2 * N, "t", "p")  # named's and auto's samples, nothing refused
        assert meta.size == 2 * N
        # rows: named's 2 payloads + 8 samples, plain's 8, auto's 2 payloads (its own index) + 8; refused: none
        assert auto.stats()["total_count"] == 2 + N + N + 2 + N
        assert all(torch.equal(v["pv"], w["pv"]) for v, w in zip(data["mm"], big + big, strict=True))


def _race_put(address: str, topic: str, p: int, seed: int, start: Any, put: dict[int, Any], errors: list[Any]) -> None:
    """Producer ``p`` of a race: even ones put an image that repeats in the put ("auto" dedups it), odd ones not."""
    g = torch.Generator().manual_seed(seed + p)
    image = torch.rand((N, 32, 64), generator=g)  # 8 KiB a sample
    if p % 2 == 0:
        image = image[:1].repeat(N, 1, 1)
    try:
        with SyncQueue(topic, broker=address, dedup="auto", num_buckets=1) as q:
            start.wait(30)
            meta = q.put({"image": image, "p": torch.full((N,), p)}, partition_id="x")
            for k, i in enumerate(meta.global_indexes):
                put[i] = image[k]
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_producers_deciding_apart_at_once_store_each_field_one_way(arena_broker: BrokerProcess, seed: int) -> None:
    """Producers whose first puts of a tensor field race, one seeing it repeat (deduped) and the other not
    (plain): whichever lands first decides, the other is refused and puts again the topic's way; every sample's
    value is then read by the field's name."""
    import threading

    producers = 4
    for round_ in range(4):
        topic = f"race{round_}"
        start = threading.Barrier(producers)
        errors: list[BaseException] = []
        put: dict[int, torch.Tensor] = {}
        args = (arena_broker.address, topic)
        threads = [
            threading.Thread(target=_race_put, args=(*args, p, seed + 100 * round_, start, put, errors))
            for p in range(producers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], f"seed {seed}: {errors[0]!r}"
        with SyncQueue(topic, broker=arena_broker.address, num_buckets=1) as q:
            data, meta = q.get_batch(["image"], producers * N, "t", "x")
            assert meta.size == producers * N, f"seed {seed}: the field is stored both ways"
            got = data["image"]
            assert all(torch.equal(got[k], put[i]) for k, i in enumerate(meta.global_indexes)), f"seed {seed}"
