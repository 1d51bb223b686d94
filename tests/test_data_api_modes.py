"""The data API refuses the same bad input with the same error in embedded and broker mode, reads create nothing,
and ``partitions()["cleared"]`` counts the samples ever cleared, across a restart and a kill -9."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from persisting import ConfigError, InvalidRecordError, Queue
from persisting.tensors.meta import ProductionStatus

from .broker_fixture import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["embedded", "broker"])
def mode(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if request.param == "embedded":
        yield {"storage_path": tmp_path / "data"}
        return
    b: BrokerProcess = request.getfixturevalue("broker")
    yield {"broker": b.address}


@pytest.fixture
def broker_args() -> list[str]:
    return ["--arena-bytes", str(4 * 1024 * 1024)]


def _batch(n: int = 5) -> dict[str, Any]:
    return {"a": np.arange(n * 2, dtype=np.float32).reshape(n, 2), "b": np.arange(n, dtype=np.int64)}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_one_str_for_a_list_of_fields_is_refused(mode: dict[str, Any]) -> None:
    async def main() -> None:
        async with Queue("fields", **mode) as q:
            meta = await q.put(_batch(), partition_id="p")
            assert meta is not None
            for call in (
                q.get_meta("ab", batch_size=2, partition_id="p"),  # type: ignore[arg-type]
                q.get_batch("ab", batch_size=2, partition_id="p"),  # type: ignore[arg-type]
                q.check_ready(meta, "ab"),  # type: ignore[arg-type]
                q.get_meta([1], batch_size=2, partition_id="p"),  # type: ignore[list-item]
            ):
                with pytest.raises(ConfigError, match=r"list of field names|field names must be"):
                    await call
            with pytest.raises(ConfigError, match="list of field names"):
                meta.select_fields("ab")  # type: ignore[arg-type]
            taken = await q.get_meta(["a", "b"], batch_size=5, partition_id="p")
            assert taken.size == 5  # the refused calls took nothing

    run(main())


def test_reads_never_create_partitions(mode: dict[str, Any]) -> None:
    async def main() -> None:
        async with Queue("reads", **mode) as q:
            await q.put(_batch(), partition_id="p")
            assert (await q.get_meta(["a"], partition_id="nope")).size == 0
            assert (await q.get_meta(partition_id="nope2", batch_size=3)).size == 0
            _data, meta = await q.get_batch(["a"], partition_id="nope3")
            assert meta.size == 0
            assert sorted(await q.partitions()) == ["p"]
        async with Queue("reads", **mode) as q:
            assert sorted(await q.partitions()) == ["p"]

    run(main())


def test_cleared_counts_samples_ever_cleared_across_a_restart(
    mode: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    async def first() -> None:
        async with Queue("cleared", **mode) as q:
            meta = await q.put(_batch(), partition_id="p")
            assert meta is not None
            assert await q.clear(meta.global_indexes[:3], partition_id="p") == 3
            part = (await q.partitions())["p"]
            assert (part["samples"], part["cleared"]) == (2, 3)

    async def after() -> None:
        async with Queue("cleared", **mode) as q:
            part = (await q.partitions())["p"]
            assert (part["samples"], part["cleared"]) == (2, 3)
            assert await q.clear([0, 1, 2], partition_id="p") == 0  # cleared already: nothing new
            assert (await q.partitions())["p"]["cleared"] == 3

    run(first())
    run(after())  # after a clean close (which purges the cleared rows from Lance)
    if "broker" in mode:
        b: BrokerProcess = request.getfixturevalue("broker")
        b.kill()
        b.start()
        run(after())


def test_cleared_survives_kill_9_embedded(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal
        import numpy as np
        from persisting import Queue

        async def main():
            q = Queue("cleared", {str(tmp_path / "data")!r})
            meta = await q.put({{"a": np.zeros((5, 2), np.float32)}}, partition_id="p")
            await q.clear(meta.global_indexes[:3], partition_id="p")
            await q.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]

    async def main() -> None:
        async with Queue("cleared", tmp_path / "data") as q:
            part = (await q.partitions())["p"]
            assert (part["samples"], part["cleared"]) == (2, 3)

    run(main())


def test_get_data_of_a_cleared_sample_names_it(mode: dict[str, Any]) -> None:
    async def main() -> None:
        async with Queue("gone", **mode) as q:
            meta = await q.put(_batch(), partition_id="p")
            assert meta is not None
            await q.clear(meta.global_indexes[1:2], partition_id="p")
            with pytest.raises(ConfigError, match=rf"\[{meta.global_indexes[1]}\] were cleared"):
                await q.get_data(meta)
            kept = meta.select_samples([0, 2])
            data = await q.get_data(kept)
            assert np.asarray(data["b"]).tolist() == [0, 2]

    run(main())


def test_tags_msgpack_cannot_carry_are_refused_naming_the_tag(mode: dict[str, Any]) -> None:
    async def main() -> None:
        async with Queue("tags", **mode) as q:
            meta = await q.put(_batch(), partition_id="p")
            assert meta is not None
            first = meta.global_indexes[0]
            for bad, what in (({1, 2}, "set"), (object(), "object"), ({"x": {3: 1}}, "dict key of type int")):
                tagged = meta.with_custom_meta({first: {"ok": 1, "bad": bad}})
                with pytest.raises(ConfigError, match=f"tag 'bad' holds .*{what}.*msgpack-safe: str, int") as info:
                    await q.set_custom_meta(tagged)
                assert not isinstance(info.value, TypeError)
            await q.set_custom_meta(meta.with_custom_meta({first: {"ok": [1, "x", {"y": None}]}}))
            got = await q.check_ready(meta.select_samples([0]))
            assert got.samples[0].custom_meta == {"ok": [1, "x", {"y": None}]}

    run(main())


def test_a_reserved_field_name_in_a_tensor_batch_is_refused(mode: dict[str, Any]) -> None:
    async def main() -> None:
        async with Queue("reserved", **mode) as q:
            for name in ("_persisting_index", "_persisting_x"):
                with pytest.raises(InvalidRecordError, match="reserved for the queue"):
                    await q.put({name: np.zeros((2, 2), np.float32)}, partition_id="p")
                with pytest.raises(InvalidRecordError, match="reserved for the queue"):
                    await q.put({"a": np.zeros((2, 2), np.float32), name: [1, 2]}, partition_id="p")
            assert await q.partitions() == {}
            assert await q.get() == []

    run(main())


def test_the_docs_name_the_production_states_the_code_has() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        (page.name, name)
        for page in pages
        if page.exists()
        for name in re.findall(r"\b(?:NOT_)?PRODUCED\b|\bREADY_FOR_CONSUME\b", page.read_text())
    }
    assert named, "the docs name the production states"
    assert {name for _page, name in named} <= set(ProductionStatus.__members__), sorted(named)
