"""The handle on one topic that a ``Queue`` holds: its settings, the topic it drives, and its transfer counters.

The handle is the one place that picks the mode: with a broker address it opens a ``remote.RemoteTopic``, else
an ``embedded.EmbeddedTopic`` (several handles of one topic in one process share one engine topic there); either
is handed out as a ``topic_api.TopicAPI``, and nothing else in the client asks which one it is. The handle is the
one owner of this state; ``Queue``, its data API (data_api.py) and its tensor puts (tensor_puts.py) use it through
its methods.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine import TopicConfig, parse_location
from ..errors import ConfigError, QueueClosedError
from ..tensors.dedup import check_mode as check_dedup_mode
from ..tensors.objects import check_mode as check_objects_mode
from ..tensors.pinning import resolve as resolve_pinning
from . import embedded
from .remote import RemoteTopic
from .topic_api import TopicAPI

if TYPE_CHECKING:
    from ..engine import BackendFactory

ZEROCOPY_MODES = ("auto", "force", "off")
MOVED_KEYS = ("put_zero_copy_bytes", "put_copied_bytes", "put_spooled_bytes", "get_zero_copy_bytes", "get_copied_bytes")
# bytes of deduped fields as put, and of them stored (tensors/dedup.py): the difference is what dedup saved
DEDUP_KEYS = ("dedup_put_bytes", "dedup_stored_bytes")


def _default_backend(enable_metrics: bool) -> BackendFactory:
    # Imported at the first embedded open: Lance (with pyarrow's datasets and pandas) is ~half of the import time
    # of a process, and one that only talks to a broker never opens a backend.
    from ..storage.lance_backend import LanceBackend
    from ..storage.persisting_backend import PersistingBackend

    return PersistingBackend if enable_metrics else LanceBackend


def _resolve_backend(backend: Any) -> BackendFactory | None:
    """The backend factory asked for; None: the default (see ``_default_backend``)."""
    if backend is None:
        return None
    if isinstance(backend, type) or callable(backend):
        return backend
    raise ConfigError(
        f"backend must be a class or a factory called as backend(bucket_id, storage_path, batch_size=...), "
        f"got an instance of {type(backend).__qualname__}; pass its class"
    )


class TopicHandle:
    """A topic as one ``Queue`` sees it (see the module docstring); checks the settings when made."""

    def __init__(
        self,
        name: str,
        storage_path: str | os.PathLike[str],
        config: TopicConfig,
        *,
        zerocopy_mode: str,
        enable_metrics: bool,
        backend: Any,
        broker: str | None,
        as_tensordict: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        local_path: str | os.PathLike[str] | None = None,
        objects: str | None = None,
        dedup: Any = False,
        pin_memory: bool | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or "\x00" in name:
            raise ConfigError(f"name must be a non-empty str without NUL characters, got {name!r}")
        if zerocopy_mode not in ZEROCOPY_MODES:
            raise ConfigError(f"zerocopy_mode must be one of {ZEROCOPY_MODES}, got {zerocopy_mode!r}")
        config.validate()
        self.name = name
        # A local folder or an object-store URI (s3://, gs://, az://): checked here, refused with the reason.
        self.location = parse_location(storage_path, storage_options, local_path)
        self.storage_path: Path | str = self.location.uri or self.location.local
        self.zerocopy_mode = zerocopy_mode
        self.enable_metrics = bool(enable_metrics)
        self.as_tensordict = bool(as_tensordict)  # what get_data/get_batch return by default
        # "pickle": this process pickles values the codec cannot store and unpickles them (tensors/objects.py)
        self.objects = check_objects_mode(objects)
        self.dedup = check_dedup_mode(dedup)  # fields whose equal values a put stores once (tensors/dedup.py)
        # the broker's shared memory page-locked for CUDA (tensors/pinning.py): checked here, so a machine without
        # a GPU fails where the option is turned on; it does nothing in embedded mode (no shared memory)
        self.pin_memory = resolve_pinning(pin_memory)
        self.config = config
        self._factory = _resolve_backend(backend)
        # Broker mode: an explicit address, else PERSISTING_BROKER; the broker owns storage_path then.
        self.broker = broker if broker is not None else (os.environ.get("PERSISTING_BROKER") or None)
        if self.broker is not None and (backend is not None or config.backend_kwargs):
            raise ConfigError("backend and backend_options are the broker's settings in broker mode")
        if self.broker is not None and (storage_options or local_path is not None):
            raise ConfigError("storage_options and local_path are the broker's settings in broker mode")
        if self.location.remote and backend is not None:
            raise ConfigError("an object-store storage_path is written by the built-in Lance backend; omit backend")
        self._topic: TopicAPI | None = None
        self.closed = False
        # bytes of tensor payload moved through this handle, by path; of deduped fields put and stored
        self._moved = dict.fromkeys(MOVED_KEYS + DEDUP_KEYS, 0)

    @property
    def opened(self) -> TopicAPI | None:
        """The topic if it is open already (no await), else None."""
        return self._topic

    async def engine(self) -> TopicAPI:
        """The topic, opened on first use (embedded: replaying its log after a crash)."""
        if self.closed:
            raise QueueClosedError(f"queue {self.name!r} is closed; open a new Queue")
        if self._topic is None:
            if self.broker is not None:
                remote = RemoteTopic(self.name, self.broker, self.config, self.pin_memory)
                await remote.open()  # broker mode runs on the caller's loop
                if self.pin_memory:
                    await remote.arena.has_arena()  # maps and page-locks segment 0: its cost, or CUDA's refusal, here
                self._topic = remote
            else:
                factory = self._factory or _default_backend(self.enable_metrics)
                self._topic = await embedded.open_topic(
                    self.name, self.location, self.config, factory, id(self), self.enable_metrics
                )
        return self._topic

    async def aclose(self) -> None:
        """Release the topic (the last handle of an embedded topic flushes and closes it)."""
        self.closed = True
        topic, self._topic = self._topic, None
        if topic is not None:
            await topic.aclose()

    def moved(self, key: str, nbytes: int) -> None:
        """Count ``nbytes`` of tensor payload moved by path (``MOVED_KEYS``)."""
        self._moved[key] += nbytes

    def transfers(self) -> dict[str, int]:
        return dict(self._moved)
