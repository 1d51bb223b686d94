"""``persisting.queue``: the old name of ``persisting.storage`` (the storage backends), kept where Persisting's
users import from: ``from persisting.queue import Queue, KVInterface, LanceBackend, PersistingBackend``, and
every submodule (``import persisting.queue.backend`` gives the module ``persisting.storage.backend`` itself, so
classes, ``isinstance`` checks and pickles naming the old path stay the same objects).

``Queue`` and ``KVInterface`` live in ``persisting.client`` and the Lance backends import Lance: each is loaded
on first use, as before the rename.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .. import storage
from ..storage import InMemoryBackend, StorageBackend

if TYPE_CHECKING:
    from ..client import KVInterface, Queue
    from ..storage.lance_backend import LanceBackend
    from ..storage.persisting_backend import PersistingBackend

__all__ = ["InMemoryBackend", "KVInterface", "LanceBackend", "PersistingBackend", "Queue", "StorageBackend"]

_OLD = __name__ + "."
_NEW = storage.__name__ + "."


def __getattr__(name: str) -> Any:
    if name in ("Queue", "KVInterface"):
        from .. import client

        return getattr(client, name)
    if name in ("LanceBackend", "PersistingBackend"):
        return getattr(storage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``persisting.queue.<name>`` as the module ``persisting.storage.<name>`` (the same object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD) or importlib.util.find_spec(_NEW + fullname[len(_OLD) :]) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_NEW + spec.name[len(_OLD) :])

    def exec_module(self, module: ModuleType) -> None:
        pass  # run already, under its new name


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.append(_Alias())
