"""Benchmarks for persisting against its peers, one run each: ``python -m bench queue|broker|arena|samples``.

The ``queue`` benchmark writes and reads back small records (about 100 bytes) through persisting's ``Queue``
(``durability="sync"`` and ``"process"``) and, in the same run, through persist-queue 1.1.0 (``SQLiteQueue``
and the file-based ``Queue``); it then measures how a flush of 1,000 rows costs on an empty topic against a
topic that already holds many rows. ``broker`` (``broker_bench``), ``arena`` (``arena_bench``) and ``samples``
(``samples_bench``) measure through a broker subprocess they start. Timings are only compared within one run: the
ratios are the result.
"""

__all__: list[str] = []
