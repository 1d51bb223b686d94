"""The contract between a suite and the harness: what a suite declares (``Suite``), what its run is handed
(``Context``), and what a probe declares (``Probe``). The how-to is ``bench/harness/__init__.py``'s docstring."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report import Report


class BenchArgumentError(ValueError):
    """A suite's argument out of range; the harness prints it as ``python -m bench NAME: message`` and exits 2."""


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A suite with only the harness's flags."""


@dataclass(frozen=True, slots=True)
class Suite:
    """One benchmark suite, as ``python -m bench NAME`` runs it.

    ``run`` gets a ``Context`` and returns a ``Report``; ``arguments`` adds the suite's own flags to its parser
    (the harness adds the common ones after them); ``reps`` is the default of ``--reps`` (what one repetition is,
    the suite's help says); ``packages``: versions the run's metadata names beside the common ones (where
    installed); ``work_prefix``: the temp folder's prefix (short: brokers put their ipc sockets under it and a unix
    socket path has a limit of 107 bytes); ``reps_aliases``: old spellings of ``--reps`` that a page's figure
    still uses (accepted, hidden from ``--help``); ``once``: why the suite runs once (its figures are percentiles
    of many calls within one run): ``--reps`` above 1 is then refused with that reason, not silently ignored."""

    name: str
    help: str
    run: Callable[[Context], Report]
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    reps: int = 3
    packages: tuple[str, ...] = ()
    work_prefix: str = "pb-"
    reps_aliases: tuple[str, ...] = ()
    once: str = ""


@dataclass(frozen=True, slots=True)
class Probe:
    """A diagnostic that is not a suite (no reference, its own output): ``python -m bench NAME`` runs ``main``
    with the rest of the command line; ``parser`` builds its argument parser (the docs-command test parses each
    page's command with it, without running)."""

    name: str
    help: str
    parser: Callable[[], argparse.ArgumentParser]
    main: Callable[[list[str] | None], int]


@dataclass(slots=True)
class Context:
    """What a suite's run is handed: its parsed ``args`` (the suite's flags and the common ones), a fresh ``work``
    folder (removed after the run), and the common settings, checked."""

    args: argparse.Namespace
    work: Path
    reps: int
    seed: int
    progress: bool
    plot: Path | None
    suite: str

    def say(self, line: str) -> None:
        """A progress line on stderr (stdout holds the report), unless ``--no-progress``."""
        if self.progress:
            print(f"{self.suite}: {line}", file=sys.stderr, flush=True)
