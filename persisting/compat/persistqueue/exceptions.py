"""persist-queue's exceptions: persisting's own, which also subclass the standard library's ``queue.Empty`` and
``queue.Full`` (persist-queue 1.1.0's do not) and ``persisting.errors.PersistingError``."""

from persisting.errors import Empty, Full

__all__ = ["Empty", "Full"]
