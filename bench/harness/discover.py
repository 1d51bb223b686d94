"""Finding the suites and probes: every folder of bench/ (but the harness's own: ``harness``, ``common``,
``probes``) is a suite whose ``__init__`` exposes ``SUITE``; every module of bench/probes/ exposes ``PROBE``.
Nothing lists them in one place, so that two people adding suites never edit the same file."""

from __future__ import annotations

import importlib
import pkgutil

import bench
import bench.probes

from .suite import Probe, Suite

NOT_SUITES = frozenset({"harness", "common", "probes"})


def suite_folders() -> list[str]:
    return sorted(i.name for i in pkgutil.iter_modules(bench.__path__) if i.ispkg and i.name not in NOT_SUITES)


def suites() -> dict[str, Suite]:
    """Suite name -> its declaration, in name order. A folder that exposes no ``SUITE`` is an error (it would be
    silently missing from ``python -m bench``)."""
    out = {}
    for folder in suite_folders():
        suite = getattr(importlib.import_module(f"bench.{folder}"), "SUITE", None)
        if not isinstance(suite, Suite):
            raise TypeError(f"bench/{folder}/__init__.py must define SUITE = bench.harness.Suite(...), not {suite!r}")
        if suite.name in out:
            raise ValueError(f"two suites are named {suite.name!r}: rename one (bench/{folder}/)")
        out[suite.name] = suite
    return dict(sorted(out.items()))


def probes() -> dict[str, Probe]:
    """Probe name -> its declaration, one per module of bench/probes/ (``PROBE``), in name order."""
    out = {}
    for info in pkgutil.iter_modules(bench.probes.__path__):
        probe = getattr(importlib.import_module(f"bench.probes.{info.name}"), "PROBE", None)
        if not isinstance(probe, Probe):
            raise TypeError(f"bench/probes/{info.name}.py must define PROBE = bench.harness.Probe(...)")
        out[probe.name] = probe
    return dict(sorted(out.items()))
