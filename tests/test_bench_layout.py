"""bench/'s layers: the harness imports only itself; ``bench/common/`` the harness and itself; a suite the harness,
``common`` and its own folder, never another suite's (what two suites share moves to ``common``); a probe may
also import a suite's modules (it takes one step of that suite apart). Imports inside functions count too."""

from __future__ import annotations

from pathlib import Path

from .test_architecture import _all_imports, _modules

SHARED = ("bench.harness", "bench.common")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def allowed(module: str, imported: str) -> bool:
    """Whether bench module ``module`` may import bench module ``imported``."""
    if not _within(imported, "bench") or imported == "bench":
        return True
    if _within(module, "bench.harness"):  # discover.py lists the probes' package (and finds suites by name)
        return _within(imported, "bench.harness") or imported == "bench.probes"
    if _within(module, "bench.common"):
        return any(_within(imported, p) for p in SHARED)
    if _within(module, "bench.probes"):
        return not _within(imported, "bench.probes") or imported == "bench.probes"
    parts = module.split(".")
    if len(parts) < 2:  # bench itself, bench.__main__: the entry point
        return True
    own = ".".join(parts[:2])
    return any(_within(imported, p) for p in (*SHARED, own))


def crossings(modules: list[tuple[str, Path]]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, path in modules
        if _within(module, "bench")
        for name in _all_imports(module, path)
        if not allowed(module, name)
    )


def test_no_suite_imports_another_suites_folder() -> None:
    bad = crossings(list(_modules()))
    assert not bad, f"bench/ imports across its layers: {bad}; move what two suites share to bench/common/"


def test_the_check_sees_a_crossing(tmp_path: Path) -> None:
    """The rule fails where it should: a suite reaching into another's folder, a shared piece reaching into a
    suite, the harness reaching into common; and passes its own folder and the shared ones."""
    src = tmp_path / "m.py"
    src.write_text("from bench.persist.workload import MiB\nfrom bench.common.records import make_records\n")
    known = dict(_modules())
    assert "bench.persist.workload" in known and "bench.common.records" in known
    assert allowed("bench.multimodal.stream", "bench.common.records")
    assert allowed("bench.multimodal.stream", "bench.multimodal.options")
    assert allowed("bench.multimodal.stream", "bench.harness.report")
    assert not allowed("bench.multimodal.stream", "bench.persist.workload")
    assert not allowed("bench.common.flush", "bench.queue.stores")
    assert not allowed("bench.harness.cli", "bench.common.plots")
    assert allowed("bench.probes.arena_steps", "bench.arena.batches")
    assert crossings([("bench.multimodal.stream", src)]) == ["bench.multimodal.stream imports bench.persist.workload"]


def test_bench_is_folders_every_one_a_suite_but_the_harness_common_and_probes() -> None:
    """No module loose at bench/'s top (a suite's piece lives in its folder, a shared one in common/), and every
    other folder is a suite ``python -m bench`` lists, under its own help."""
    import bench
    from bench.harness import discover

    root = Path(bench.__file__).parent
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "__main__.py"]
    suites = discover.suites()
    assert len(suites) == len(discover.suite_folders()) and all(s.help for s in suites.values())
    assert len({s.help for s in suites.values()}) == len(suites)  # each its own line
