"""Benchmarks for persisting: ``python -m bench queue --n 10000 --n 1000000 --format rst``.

The ``queue`` benchmark writes and reads back small records (about 100 bytes) through persisting's ``Queue``
(``durability="sync"`` and ``"process"``) and, in the same run, through persist-queue 1.1.0 (``SQLiteQueue``
and the file-based ``Queue``); it then measures how a flush of 1,000 rows costs on an empty topic against a
topic that already holds many rows. Timings are only compared within one run: the ratios are the result.
"""

__all__: list[str] = []
