"""Root conftest: the ```python blocks of docs/ and README.md run as tests (pytest-markdown-docs).

The plugin's own ``--markdown-docs`` switch would also import every ``.py`` file under ``tests/`` to read its
docstrings, which runs the worker scripts there; so the markdown files are collected here instead, with the
plugin's collector. Each block runs in a fresh empty folder of its own, so a page's ``./data`` never lands in
the checkout and no two examples share a topic (docs/contributing.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_markdown_docs.plugin import MarkdownTextFile

_ROOT = Path(__file__).resolve().parent
_DOCS = _ROOT / "docs"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".md" and (file_path == _ROOT / "README.md" or _DOCS in file_path.parents):
        return MarkdownTextFile.from_parent(parent, path=file_path)
    return None


@pytest.fixture(autouse=True)
def _markdown_example_in_tmp_dir(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("markdown-docs") is None:
        yield
        return
    before = Path.cwd()
    os.chdir(request.getfixturevalue("tmp_path"))
    try:
        yield
    finally:
        os.chdir(before)
