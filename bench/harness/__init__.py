"""The bench harness: one runner for every suite. It owns the common flags, the medians, the ratios to the same
run's references, the run's metadata and the rendering; a suite owns only its workload and its tables.

How to port (or write) a suite
==============================

1. **A folder.** ``bench/<name>/`` (a package; ``-`` in the suite's name is ``_`` in the folder's). Its
   ``__init__.py`` declares ``SUITE = Suite(...)`` and nothing heavy: ``python -m bench`` imports every suite's
   ``__init__`` to list them, so import the workload (torch, Ray, the broker...) inside ``run``. The workload,
   its peers (the references it is compared with) and its report live beside it, one concept per module
   (``workload.py``, ``worker.py``, ``report.py``, ``chart.py``... as it needs). No central list: the harness
   finds the folder (``discover.py``: every package of bench/ but ``harness``, ``common`` and ``probes``).
   ``bench/sizes/`` is the worked example.

2. **What a suite declares** (``suite.Suite``): ``name`` (the command: ``python -m bench NAME``), ``help`` (one
   line, shown by ``python -m bench``), ``arguments(parser)`` (its own flags only, with ranges said in their
   help), ``run(ctx) -> Report``, ``reps`` (the default of ``--reps``; say in ``help`` or a flag's help what one
   repetition is), ``packages`` (versions the metadata names beside the common ones), ``work_prefix`` (the temp
   folder's prefix, short: unix socket paths under it are limited to 107 bytes), ``reps_aliases`` (an old
   spelling of the repetition flag, ``--runs`` or ``--repeat``, accepted hidden, only while a page's figure uses
   it), ``once`` (why a suite runs once, e.g. its figures are percentiles of many calls within the run: then
   ``--reps`` above 1 is refused with that reason instead of being ignored).

3. **The common flags**, added by the harness after the suite's (``cli.parser``): ``--reps N``, ``--dir DIR``
   (the work folder's parent), ``--seed N``, ``--format console|md|json``, ``--plot DIR``, ``--no-progress``.
   Do not add them again. The run reads them from ``ctx`` (``suite.Context``): ``ctx.reps``, ``ctx.seed``,
   ``ctx.work`` (a fresh folder, removed after the run), ``ctx.progress``, ``ctx.plot``, and its own flags from
   ``ctx.args``; ``ctx.say(line)`` writes a progress line to stderr. A flag out of range: raise
   ``BenchArgumentError("--x must be ...")`` (usage and exit status 2, like argparse).

4. **What run() returns** (``report.Report``): a ``title``, ``tables``, ``notes`` (lines after the tables: what
   was skipped, broker log lines worth a look), ``meta`` (what the run's metadata adds: the records, the broker's
   command line), ``data`` (more JSON fields), ``charts`` (optional), ``failed`` (why the run failed, one reason
   each, where the suite checks figures that must hold: ``python -m bench`` then prints them on stderr and exits
   1; chaos sets it when a figure that must be 0 is not). The harness adds the command line, git
   revision (+ local changes), package versions, python, the machine (cores, load average at start and end,
   RAM), the seed, the work folder, and the run's wall time.

5. **Rows, references, ratios** (``report.Table``, ``report.Row``, ``report.Metric``). A table declares its
   ``labels`` (text columns that name a row), ``metrics`` (measured columns, each with its unit in its name and
   ``higher_is_better``), ``references`` (row keys) and ``extra`` text columns. Each row holds one value per
   rep for each metric (``table.add("64 MiB", "persisting", group="64 MiB", GB_s=[...])``: keyword = the
   metric's name with non-alphanumerics as ``_``). The harness shows the median, with ``runs=True`` every rep of
   the first metric too, and for each reference a column ``vs KEY``: the first metric's median over the median of
   the row whose ``key`` (default: its last label) is KEY *in the same group* (e.g. the same batch size),
   inverted for a lower-is-better metric, so that above 1 always means better than the reference. Do not compute
   medians or ratios in a suite; ``table.ratio(row, key)`` gives the harness's ratio where a suite needs it (an
   aim). A metric with ``quantile=q`` takes the nearest-rank quantile of its samples instead of their median:
   for rows whose samples are many calls timed within one run (``p50 us``; bench/broker/report.py). A table
   without metrics is text only (its ``labels`` are its headers; rows hold only labels).
   ``bench/common/sections.py`` turns a report of pre-formatted sections beside harness tables (the form broker,
   arena and samples still have for their aims, counters and per-case rows) into a ``Report``; new suites use
   metric tables.

6. **Charts.** ``--plot DIR`` works for every suite: without ``Report.charts`` the harness draws each measured
   table (median of its first metric per row); a suite with a better picture sets ``charts(folder, subtitle)``
   and returns the paths it wrote (``bench/harness/plots.py``: ``pyplot``, ``save``, ``cdf``).

7. **Shared pieces** live in ``bench/common/``: ``broker_process.py`` (start a ``persisting-broker`` subprocess,
   read its log and CPU), ``measure.py`` (nearest-rank percentiles, RSS), ``records.py`` (the ~100-byte records),
   ``workers.py`` (spawned worker processes, their barriers and results), ``tq_cluster.py`` (TransferQueue on a
   local Ray cluster), ``arena_stream.py`` (a stream beyond the arena and its fdatasync reference),
   ``torch_shared.py`` (the torch.multiprocessing references' copy)... A piece two suites use moves there. The
   layers (tests/test_bench_layout.py checks them): ``harness`` imports only itself; ``common`` imports the
   harness and itself; a suite imports the harness, ``common`` and its own folder, never another suite's folder
   (nor tests/); a probe may also import a suite's modules (it takes one step of that suite apart).

8. **Probes** (a diagnostic of one step, no reference, its own output) are modules of ``bench/probes/``, each
   declaring ``PROBE = Probe(name, help, parser, main)``; ``python -m bench NAME`` runs ``main(argv)``, and so does
   ``python -m bench.probes.MODULE``. ``python -m bench`` lists suites and probes, one line each.

9. **A smoke test** per suite, in one of tests/test_bench_suites.py, tests/test_bench_tensor_suites.py,
   tests/test_bench_ray_suites.py, tests/test_bench_suites_second.py (files of about equal time: ``./dev test`` gives
   whole files to its two workers): run ``python -m bench NAME`` in a subprocess (``tests/bench_run.py``: ``smoke``)
   at its smallest size with ``--reps 1`` and the fewest cases the suite lets you pick, but its real workload and its
   reference at least once, and check the rendered output has its rows and its reference ratio (``--format json``:
   ``tables[i]["rows"][j]["vs"]``). A few seconds each: all of them together stay near 3 minutes.
   tests/test_bench_docs.py parses every ``python -m bench ...`` command of README.md and docs/ with the suite's
   parser: a flag renamed breaks it until the page says the new one."""

from .report import Metric, Report, Row, Table
from .suite import BenchArgumentError, Context, Probe, Suite

__all__ = ["BenchArgumentError", "Context", "Metric", "Probe", "Report", "Row", "Suite", "Table"]
