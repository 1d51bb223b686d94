"""The tree keeps its shape: public and Persisting-compatible imports; no import circles between modules (at load
time or through imports inside functions) nor between the library's folders; each import inside a function
listed with its reason; the broker on the engine's interface only; no class with two project bases; modules of
a readable size; docstrings that name files name ones that exist."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import itertools
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("persisting", "broker", "bench")
MODULE_LINES_MAX = 420  # "about 400": a module past it is two concepts


# Project-internal imports made inside a function, each with why it waits (a circle is never a reason: move what
# both modules need to one they may both import). An import of a module outside PACKAGES (torch, lance, ray)
# may wait without a line here, and so may a package's own modules that its ``__getattr__`` loads on first use.
# A listed import that is gone fails too, so the list only shrinks.
DEFERRED_IMPORTS: dict[tuple[str, str], str] = {
    ("persisting.client.handle", "persisting.storage.lance_backend"): "Lance loads at the first embedded open",
    (
        "persisting.client.handle",
        "persisting.storage.persisting_backend",
    ): "Lance loads at the first embedded open",
    ("persisting.compat.transfer_queue.interface", "persisting.compat.transfer_queue.ray_plane"): (
        "Ray and persisting.ray load only when init joins the plane on several nodes"
    ),
    ("persisting.engine.location", "persisting.engine.object_store"): "Lance: only object-store locations load it",
    ("persisting.ray.queue", "persisting.engine.object_store"): "Lance: only once a moved broker was refused",
    ("persisting.queue", "persisting.client"): "the old name of storage/ gives Queue and KVInterface on first use",
    ("persisting.queue", "persisting.storage.lance_backend"): "the old name of storage/ loads Lance on first use",
    ("persisting.queue", "persisting.storage.persisting_backend"): "the old name of storage/ loads Lance on first use",
    # broker/ (its owner removes what goes)
    ("broker.__main__", "broker.metrics"): "prometheus_client loads only with --metrics",
    ("broker.__main__", "persisting.client.connection"): "the status command's client (loaded anyway: may move up)",
    ("broker.server", "broker.metrics"): "prometheus_client loads only with --metrics",
    # bench/ (a suite's package loads its workload inside run, so that `python -m bench` lists fast: those are a
    # package's own modules, which need no line, see the test)
    ("bench.multimodal.grpo_workers", "persisting"): (
        "a peer's worker process (torch.mp, TransferQueue) never loads persisting: its peak RSS is a figure"
    ),
    ("bench.pq.multiprocess", "bench.common.broker_process"): (
        "a spawned worker imports its module: only the library it measures may load in it (its import time is timed)"
    ),
    ("bench.pq.multiprocess", "persisting.compat.persistqueue"): (
        "a spawned worker imports its module: only the library it measures may load in it (its import time is timed)"
    ),
}


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


@functools.cache
def _known() -> dict[str, Path]:
    return dict(_modules())


def _type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name | ast.Attribute) and ast.unparse(node.test).endswith("TYPE_CHECKING")


def _all_imports(module: str, path: Path) -> dict[str, bool]:
    """The project modules ``module`` imports (outside ``TYPE_CHECKING`` blocks), each with whether the import
    waits inside a function (True) or runs when the module is loaded (False)."""
    known = _known()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, bool] = {}

    def note(name: str, deferred: bool) -> None:
        if name in known and name != module:
            found[name] = found.get(name, True) and deferred

    tree = ast.parse(path.read_text())
    # A package that loads its names on first use (a module ``__getattr__``) names them under TYPE_CHECKING for
    # the type checker: those are its imports, made inside ``__getattr__``.
    lazy = path.name == "__init__.py" and any(
        isinstance(node, ast.FunctionDef) and node.name == "__getattr__" for node in tree.body
    )

    def walk(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                if lazy and node is tree:
                    walk(ast.Module(body=child.body, type_ignores=[]), True)
                for other in child.orelse:  # ``else:`` of a TYPE_CHECKING block runs
                    walk(ast.Module(body=[other], type_ignores=[]), deferred)
                continue  # otherwise types only: never imported at run time
            inside = deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    source = ".".join([*base, child.module] if child.module else base)
                else:
                    source = child.module or ""
                for alias in child.names:
                    name = f"{source}.{alias.name}"
                    note(name if name in known else source, inside)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    note(alias.name, inside)
            walk(child, inside)

    walk(tree, False)
    return found


def _imports(module: str, path: Path) -> set[str]:
    """Modules ``module`` imports when it is loaded (not inside functions or TYPE_CHECKING blocks)."""
    return {name for name, deferred in _all_imports(module, path).items() if not deferred}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (module -> modules it imports), as the path around it; None if there is none."""
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        seen[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if seen.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in seen and (found := visit(dep)) is not None:
                return found
        path.pop()
        seen[module] = 2
        return None

    for module in sorted(graph):
        if module not in seen and (found := visit(module)) is not None:
            return found
    return None


def test_public_and_persisting_compatible_imports() -> None:
    import persisting.queue.backend

    import persisting
    import persisting.errors
    import persisting.queue
    import persisting.sampler
    import persisting.storage.lance_backend
    from persisting.queue import KVInterface, LanceBackend, PersistingBackend, Queue

    assert Queue is persisting.Queue and KVInterface is persisting.KVInterface
    # persisting.queue is storage/'s old name: its submodules are storage's own module objects.
    assert persisting.queue.backend is persisting.storage.backend
    assert LanceBackend is persisting.storage.lance_backend.LanceBackend
    assert pickle.loads(b"cpersisting.queue.lance_backend\nLanceBackend\n.") is LanceBackend
    assert issubclass(PersistingBackend, LanceBackend)
    assert persisting.sampler.RankAwareSampler is persisting.RankAwareSampler
    assert persisting.sampler.GRPOGroupNSampler is persisting.GRPOGroupNSampler
    samplers = {name for name in persisting.__all__ if name.endswith("Sampler")}
    assert set(persisting.sampler.__all__) == samplers, "persisting.sampler offers every sampler persisting does"
    assert all(getattr(persisting.sampler, name) is getattr(persisting, name) for name in samplers)
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
    """No circle, whether its imports run at load time or wait inside functions (a deferred import only hides a
    circle until both modules are loaded)."""
    imports = {module: _all_imports(module, path) for module, path in _modules()}
    circle = _circle({module: set(found) for module, found in imports.items()})
    if circle is not None:
        steps = [f"{a} -> {b}" + (" (in a function)" if imports[a][b] else "") for a, b in itertools.pairwise(circle)]
        raise AssertionError("import circle: " + ", ".join(steps) + "; move what both need to a module both import")


def _folder(module: str) -> str:
    """The concept a module belongs to: its folder under the library (``persisting.tensors``), else its package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "persisting" else parts[0]


def test_no_circles_between_folders() -> None:
    """The library's folders stack: what one folder uses of another, that one never uses back (say, ``tensors``
    builds on ``wire``, so the codec learns tensor kinds from a registry, not from ``tensors``)."""
    graph: dict[str, set[str]] = {}
    for module, path in _modules():
        uses = {_folder(name) for name in _all_imports(module, path)} - {_folder(module)}
        graph.setdefault(_folder(module), set()).update(uses)
    for used in set().union(*graph.values()):
        graph.setdefault(used, set())
    circle = _circle(graph)
    assert circle is None, "folders import each other: " + " -> ".join(circle or [])


def test_deferred_imports_are_listed_with_their_reason() -> None:
    deferred = {(module, name) for module, path in _modules() for name, d in _all_imports(module, path).items() if d}
    # A package loading its own modules' names on first use needs no line: it cannot close a circle by itself.
    deferred = {(module, name) for module, name in deferred if not name.startswith(module + ".")}
    unlisted = sorted(deferred - DEFERRED_IMPORTS.keys())
    assert not unlisted, (
        f"imports inside functions not in DEFERRED_IMPORTS: {unlisted}; import at the top of the module, or list "
        "the import with why it must wait (a heavy module loaded on first use; never a circle)"
    )
    ours = {key for key in DEFERRED_IMPORTS if key[0].split(".")[0] in PACKAGES}
    gone = sorted(ours - deferred)
    assert not gone, f"DEFERRED_IMPORTS lists imports that no longer wait in a function: {gone}; remove them"


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


_FILE_MENTION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)\b")


_FOLDERS = {p.name for p in ROOT.iterdir() if p.is_dir()} | {
    p.name for package in ("persisting", "broker", "bench", "tests") for p in (ROOT / package).rglob("*") if p.is_dir()
}


def _mention_resolves(mention: str, path: Path) -> bool:
    """A ``dir/file.py`` whose ``dir`` is a folder of this checkout: from the checkout's root, the library's, or the
    module's folder (or the one above it); a bare ``file.py`` in the module's own package tree (a broker or bench
    module may also name the library's files)."""
    if "/" in mention:
        if mention.split("/")[0] not in _FOLDERS:
            return True  # another project's file (persist-queue's benchmark/run_benchmark.py)
        return any((base / mention).exists() for base in (ROOT, ROOT / "persisting", path.parent, path.parent.parent))
    package = path.relative_to(ROOT).parts[0]
    trees = [ROOT / package, *([ROOT / "persisting"] if package != "persisting" else [])]
    return (path.parent / mention).exists() or any(next(tree.rglob(mention), None) for tree in trees)


def test_docstrings_name_files_that_exist() -> None:
    stale = []
    for _module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                for mention in _FILE_MENTION.findall(ast.get_docstring(node, clean=False) or ""):
                    if not _mention_resolves(mention, path):
                        stale.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)} names {mention}")
    assert not stale, f"docstrings name files that do not exist (moved or renamed?): {stale}"


def test_modules_stay_readable() -> None:
    long = {module: n for module, path in _modules() if (n := len(path.read_text().splitlines())) > MODULE_LINES_MAX}
    assert not long, f"modules over {MODULE_LINES_MAX} lines: {long}"
