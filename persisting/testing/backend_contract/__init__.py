"""Conformance suite for storage backends: every rule of the contract in ``persisting.storage.backend``.

Subclass ``BackendContract`` in a test module (the class name must start with ``Test`` so pytest collects it)::

    from persisting.testing.backend_contract import BackendContract

    class TestMyBackend(BackendContract):
        backend_class = MyBackend   # or override make_backend(self, bucket_id, storage_path, **kwargs)
        durable = True              # False: flush() does not survive a new backend object (declare it too)

Everything runs on real storage in pytest's ``tmp_path``. Each test drives one backend object from one event
loop (``asyncio.run``, as the engine does), so no async pytest plugin is needed. Knobs:

``durable``
    Whether rows survive ``flush()`` + a new backend object on the same path. Must match the backend's own
    ``durable`` class attribute (``test_declares_durability``); the reopen tests are skipped when false.
``mark_non_durable_for_queue``
    For a non-durable backend that does not declare ``durable = False``: the ``Queue`` end-to-end test sets
    ``durable = False`` on each instance so the engine keeps and replays its log. Prefer declaring it.
``expected_failures``
    ``{"test_name": "why"}``: those tests are marked ``xfail(strict=True)`` for this backend (a known gap that
    must be fixed or kept documented; the mark fails the run once the test starts passing).
``timeout_seconds``
    Seconds after which one async test is cancelled, so that a backend that hangs fails instead of blocking.
"""

from ._support import Backend, Row, assert_rows_equal, async_test, collect, flat, row_batches, same_value
from .end_to_end import EndToEndRules


class BackendContract(EndToEndRules):
    """Conformance tests for one storage backend. Subclass with a ``Test`` name and set ``backend_class``.

    The rules come in four parts, each extending the one before (rows.py <- streams.py <- durability.py <-
    end_to_end.py, on _base.ContractBase), so that every class here has one base."""


__all__ = [
    "Backend",
    "BackendContract",
    "Row",
    "assert_rows_equal",
    "async_test",
    "collect",
    "flat",
    "row_batches",
    "same_value",
]
