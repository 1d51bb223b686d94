"""Test helpers for code built on persisting. Needs the ``test`` extra (pytest, hypothesis).

``persisting.testing.backend_contract.BackendContract`` is the conformance suite for storage backends: subclass
it in a test module, point it at your backend, and pytest runs every check of the contract written in
``persisting.storage.backend``.
"""

import pytest

# Plain ``assert`` in the suite reports operands like a test file does (must run before the module is imported).
pytest.register_assert_rewrite("persisting.testing.backend_contract")
