"""numpy, imported at its first use: ``np`` here stands for the module in the modules a broker client loads.

A process that only puts and takes records through a broker (a persist-queue worker) never touches an array,
and ``import numpy`` is a third of what ``import persisting`` costs such a process at start (issue 22). The
modules that handle tensors import ``np`` from here (``numpy`` itself under ``TYPE_CHECKING``): the first
attribute read imports numpy and keeps the attribute, so later reads cost what a module attribute does.

The type checks on the record path (``isinstance(value, np.ndarray)``) must not import numpy either: while numpy
is not imported, no value can be one of its arrays, scalars or integers, so those names read as a class nothing
is an instance of (not kept: once anything imports numpy, the real types are used).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

# Names the tensor modules use in isinstance checks only (never call or subclass them before numpy is loaded).
TYPE_NAMES = frozenset({"ndarray", "generic", "integer"})


class _NotLoaded:
    """No value is an instance of this: what ``np.ndarray`` & co. are while numpy is not imported."""


class LazyNumpy:
    """The numpy module, imported at the first read of one of its names (a read kept once numpy is imported)."""

    def __getattr__(self, name: str) -> Any:
        module = sys.modules.get("numpy")
        if module is None:
            if name in TYPE_NAMES:
                return _NotLoaded
            module = importlib.import_module("numpy")
        value = getattr(module, name)
        setattr(self, name, value)
        return value


np: Any = LazyNumpy()
