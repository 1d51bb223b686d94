"""The tree keeps its shape: public and Persisting-compatible imports, no import circles, the broker on the
engine's interface only, no class with two project bases, modules of a readable size."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("persisting", "broker", "bench")
MODULE_LINES_MAX = 420  # "about 400": a module past it is two concepts


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _imports(module: str, path: Path) -> set[str]:
    """Modules ``module`` imports when it is loaded (not inside functions or TYPE_CHECKING blocks)."""
    known = dict(_modules())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                name = f"{source}.{alias.name}"
                found.add(name if name in known else source)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known and m != module}


def test_public_and_persisting_compatible_imports() -> None:
    import persisting
    import persisting.errors
    import persisting.queue
    import persisting.queue.backend
    import persisting.sampler
    from persisting.queue import KVInterface, LanceBackend, PersistingBackend, Queue

    assert Queue is persisting.Queue and KVInterface is persisting.KVInterface
    assert LanceBackend.__module__ == "persisting.queue.lance_backend"
    assert issubclass(PersistingBackend, LanceBackend)
    assert persisting.sampler.RankAwareSampler is persisting.RankAwareSampler
    assert persisting.sampler.GRPOGroupNSampler is persisting.GRPOGroupNSampler
    assert persisting.errors.PersistingError is persisting.PersistingError
    for name in persisting.__all__:
        assert getattr(persisting, name) is not None
    if importlib.util.find_spec("torch") is not None:
        from persisting.client.loader import StreamingDataset
        from persisting.loader import StreamingDataset as Documented

        assert Documented is StreamingDataset
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = persisting.queue.Nope  # type: ignore[attr-defined]


def test_no_import_circles() -> None:
    graph = {module: _imports(module, path) for module, path in _modules()}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        seen[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if seen.get(dep) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(dep) :], dep]))
            if dep not in seen:
                visit(dep)
        path.pop()
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module)


def test_the_broker_drives_the_engine_through_its_interface_only() -> None:
    for module, path in _modules():
        if not module.startswith("broker"):
            continue
        inner = sorted(m for m in _imports(module, path) if m.startswith("persisting.engine."))
        assert not inner, f"{module} imports engine internals {inner}; use what persisting.engine exports"
    exported = importlib.import_module("persisting.engine").__all__
    assert "Topic" in exported and "TopicConfig" in exported


def test_no_class_has_two_project_bases() -> None:
    for module, _path in _modules():
        if module.endswith("__main__") or module == "persisting.demo.__main__":
            continue
        loaded = importlib.import_module(module)
        for _name, cls in inspect.getmembers(loaded, inspect.isclass):
            if cls.__module__ != module:
                continue
            ours = [b for b in cls.__bases__ if b.__module__.split(".")[0] in PACKAGES]
            assert len(ours) <= 1, f"{module}.{cls.__qualname__} inherits from {ours}: compose instead"


def test_modules_stay_readable() -> None:
    long = {module: n for module, path in _modules() if (n := len(path.read_text().splitlines())) > MODULE_LINES_MAX}
    assert not long, f"modules over {MODULE_LINES_MAX} lines: {long}"
