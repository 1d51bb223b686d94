"""Benchmarks of persisting against its peers and the machine's limits: ``python -m bench`` lists them.

Layout: ``harness/`` runs every suite (common flags, medians, same-run ratios, metadata, rendering; its docstring
is the how-to for writing a suite); each other folder is one suite (``sizes/``, ``queue/``, ``broker/``...) with
its workload, its peers and its report; ``common/`` holds what several suites share; ``probes/`` holds diagnostics
of one step. Timings are only compared within one run: the ratios are the result.
"""

__all__: list[str] = []
