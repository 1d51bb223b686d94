"""Diagnostics that are not suites: each module a ``PROBE`` (``bench.harness.Probe``), run as ``python -m bench
NAME`` or ``python -m bench.probes.MODULE``."""
