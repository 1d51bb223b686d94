"""persist-queue 1.1.0's own test suite, run against ``persisting.compat.persistqueue``.

The test files here are persist-queue's, copied unchanged (its BSD license: see LICENSE-persist-queue). This
conftest registers the compat package and its submodules under the name ``persistqueue`` in ``sys.modules``
before they are imported, so ``from persistqueue import ...`` in them gets the compat layer (persist-queue itself
need not be installed). Tests that assert persist-queue's private internals are skipped, each with its reason
(also listed in the README).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

import persisting.compat.persistqueue as compat
from persisting.compat.persistqueue._store import STORAGE_SUFFIX

SUBMODULES = (
    "exceptions",
    "serializers",
    "serializers.pickle",
    "serializers.json",
    "serializers.msgpack",
    "serializers.cbor2",
    "queue",
    "sqlqueue",
    "sqlackqueue",
    "pdict",
    "priorityqueue",
    "async_queue",
    "async_sqlqueue",
)

sys.modules["persistqueue"] = compat
for _name in SUBMODULES:
    sys.modules[f"persistqueue.{_name}"] = importlib.import_module(f"persisting.compat.persistqueue.{_name}")

# test node id (file::Class::test, parametrized ids folded) -> why it is not run
CHUNK_FILES = "writes into persist-queue's chunk file (_qfile(0)) to corrupt it; items here are not in chunk files"
FILE_HANDLES = "asserts persist-queue's chunk file handles (headf/tailf) are None after close"
CONNECTION = "asserts persist-queue's SQLite connection attribute (_conn) is None after close"
SKIPPED: dict[str, str] = {
    "test_queue.py::TestPersist::test_del": FILE_HANDLES,
    "test_async_queue.py::TestAsyncQueue::test_async_serializer": (
        "asserts the serializer's dump is called twice per put, once for persist-queue's info file (async serializers "
        "themselves work here)"
    ),
    "test_async_queue.py::TestAsyncQueue::test_file_operations_error_handling": CHUNK_FILES,
    "test_async_queue.py::TestAsyncQueue::test_context_manager": FILE_HANDLES,
    "test_async_queue.py::TestAsyncSQLiteQueue::test_context_manager": CONNECTION,
    "test_async_edge_cases.py::TestAsyncQueueEdgeCases::test_pickle_error_handling": CHUNK_FILES,
    "test_async_edge_cases.py::TestAsyncQueueEdgeCases::test_eof_error_handling": CHUNK_FILES,
    "test_async_edge_cases.py::TestAsyncQueueEdgeCases::test_permission_error_handling": (
        "patches persistqueue.async_queue.aiofiles.os.replace, the library persist-queue writes its info file with"
    ),
    "test_async_edge_cases.py::TestAsyncQueueEdgeCases::test_queue_close_without_items": FILE_HANDLES,
    "test_async_edge_cases.py::TestAsyncQueueEdgeCases::test_queue_close_with_items": FILE_HANDLES,
    "test_async_edge_cases.py::TestAsyncSQLiteQueueEdgeCases::test_queue_close_without_connection": CONNECTION,
    "test_async_edge_cases.py::TestAsyncSQLiteQueueEdgeCases::test_queue_close_with_connection": CONNECTION,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        base = item.nodeid.split("persistqueue_suite/", 1)[-1].split("[", 1)[0]
        reason = SKIPPED.get(base)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"persist-queue internals: {reason}"))


@pytest.fixture(autouse=True)
def _remove_orphaned_storage() -> Iterator[None]:
    """persist-queue's async tests open a queue on a temporary database file and then delete only that file (SQLite
    leaves nothing else behind); the storage folder beside it (``<file>-persisting``) is removed here."""
    pattern = os.path.join(tempfile.gettempdir(), "*" + STORAGE_SUFFIX)
    before = set(glob.glob(pattern))
    yield
    for folder in set(glob.glob(pattern)) - before:
        if not os.path.exists(folder[: -len(STORAGE_SUFFIX)]):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _close_what_a_test_left_open() -> Iterator[None]:
    """persist-queue's tests often drop a queue without closing it (its SQLite handles need no close); here a
    handle left open would keep its topic's flush loop running after the test deleted its folder. Each handle a test
    left open is closed after it (a close that finds the folder gone still stops the topic)."""
    from persisting.compat.persistqueue import _twin

    before = set(_twin._open)
    yield
    for key in set(_twin._open) - before:
        handle = _twin._open[key]()
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.close()
