"""The docs check of ``./dev test`` fails on a broken link or anchor, as ``./dev docs`` does (issue 33).

``mkdocs build --strict --quiet`` passed with a broken anchor: ``--quiet`` raises mkdocs' log level above WARNING,
so strict mode counted no warnings. Both commands now run one script, ``.ci/docs-build``; these tests hold that
``dev`` runs it (and no other mkdocs build) and run it, exactly as ``dev`` does, on a copy of the docs: the copy
as it is builds, and the copy with a link and an anchor broken on purpose fails, naming both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
_SCRIPT = _ROOT / ".ci" / "docs-build"
# The entries of the checkout the build never reads or that the copy replaces (docs/ and mkdocs.yml are copied so
# that a test can break them; the rest, read by mkdocstrings and the snippets, is linked).
_NOT_LINKED = {"docs", "mkdocs.yml", "site", ".git", ".venv", "data"}


def _dev_branch(name: str) -> str:
    """The body of one ``case`` branch of ``dev`` (from ``name)`` to its ``;;``)."""
    text = (_ROOT / "dev").read_text()
    match = re.search(rf"^\s+{name}\)\n(.*?)^\s+;;", text, re.MULTILINE | re.DOTALL)
    assert match, f"dev has no '{name})' branch"
    return match.group(1)


@pytest.mark.parametrize("branch", ["test", "docs"])
def test_dev_builds_the_docs_with_the_one_script(branch: str) -> None:
    body = _dev_branch(branch)
    assert re.search(r'^\s*MKDOCS="\$VENV/bin/mkdocs" (exec )?\.ci/docs-build\b', body, re.MULTILINE), body
    # a second, different build (such as the old `mkdocs build --strict --quiet`) would let the two drift apart
    assert 'mkdocs" build' not in body and "mkdocs build" not in body
    runs = [line for line in _SCRIPT.read_text().splitlines() if '"$MKDOCS" build' in line and "#" not in line]
    assert len(runs) == 1 and "--quiet" not in runs[0] and " -q" not in runs[0], runs


def _docs_copy(tmp_path: Path) -> Path:
    site = tmp_path / "checkout"
    site.mkdir()
    for entry in _ROOT.iterdir():
        if entry.name in _NOT_LINKED or entry.name.endswith("_cache"):
            continue
        (site / entry.name).symlink_to(entry)
    shutil.copytree(_ROOT / "docs", site / "docs")
    shutil.copy(_ROOT / "mkdocs.yml", site / "mkdocs.yml")
    return site


def _build(checkout: Path) -> subprocess.CompletedProcess[str]:
    """``.ci/docs-build`` with no arguments in the copy, as ``./dev test`` runs it in the checkout."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.skip("mkdocs is not installed beside this Python (the docs extra, which ./dev test installs)")
    env = {**os.environ, "MKDOCS": str(mkdocs)}
    return subprocess.run(
        [str(_SCRIPT)], cwd=checkout, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_docs_as_they_are_build(tmp_path: Path) -> None:
    checkout = _docs_copy(tmp_path)
    done = _build(checkout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (checkout / "site" / "index.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    checkout = _docs_copy(tmp_path)
    with (checkout / "docs" / "index.md").open("a") as page:
        page.write(
            "\nBroken on purpose: [an anchor](getting-started.md#no-such-anchor-here), [a page](no-such-page.md).\n"
        )
    done = _build(checkout)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "getting-started.md#no-such-anchor-here" in out, out
    assert "no-such-page.md" in out, out
    # the two breaks and nothing else: the copy itself is sound
    assert "Aborted with 2 warnings in strict mode" in out, out
