"""Every ``python -m bench ...`` command on the docs pages and in README.md names a real suite or probe, and its
flags parse with that suite's parser (nothing runs): a flag renamed or a suite gone fails here until the page
says the new one. bench/'s suites and probes are discovered, so a new one is covered without editing this file."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness import cli, discover

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"`([^`]+)`")
PLACEHOLDERS = ("<", "...", " X ", " NAME")


def commands(text: str) -> Iterator[str]:
    """The commands of a page: lines of its code blocks (``\\`` continued, ``#`` comments cut), and inline code
    spans (which may wrap across lines)."""
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            code = line.split("#")[0] if line.lstrip().startswith("#") else line.split(" #")[0]
            if "python -m bench" in code:
                yield _tail(code)
    for span in SPAN.findall(FENCE.sub("", text)):
        if "python -m bench" in span:
            yield _tail(" ".join(span.split()))


def _tail(line: str) -> str:
    return line[line.index("python -m bench") :].strip()


def _all() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for command in commands(page.read_text()):
            if not any(p in f"{command} " for p in PLACEHOLDERS):
                out.append((str(page.relative_to(ROOT)), command))
    return out


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> str:
    """argparse's complaint, or "" when ``args`` parse."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            return "" if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    return ""


def check(command: str) -> str:
    """What is wrong with ``command`` ("" when nothing)."""
    words = [w.strip("[]") for w in shlex.split(command)]  # "[--flag]": an optional flag, which must parse too
    module, args = words[2], words[3:]
    if module != "bench":  # python -m bench.something: a module that must exist
        return "" if importlib.util.find_spec(module) is not None else f"no module {module}"
    if not args:
        return ""
    name, rest = args[0], args[1:]
    suites, probes = discover.suites(), discover.probes()
    if name in suites:
        return _parse(cli.parser(suites[name]), rest)
    if name in probes:
        return _parse(probes[name].parser(), rest)
    return f"no suite or probe named {name!r}"


def test_the_pages_hold_bench_commands() -> None:
    found = _all()
    assert len(found) > 50, found  # the extraction itself works (the pages hold well over 100)
    assert any(c.startswith("python -m bench sizes --sizes") for _, c in found)


@pytest.mark.parametrize(("page", "command"), _all())
def test_every_bench_command_on_the_pages_parses(page: str, command: str) -> None:
    problem = check(command)
    assert not problem, f"{page}: `{command}`: {problem}"


def test_a_wrong_flag_or_name_is_caught() -> None:
    assert "unrecognized arguments: --no-such-flag" in check("python -m bench sizes --no-such-flag")
    assert "no suite or probe" in check("python -m bench no-such-suite")
    assert check("python -m bench.no_such_module").startswith("no module")
    assert check("python -m bench sizes --sizes 1M --reps 1 --format md --plot charts") == ""
