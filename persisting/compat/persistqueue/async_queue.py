"""persist-queue's ``AsyncQueue``: the file queue's async form (``async with``)."""

from ._filequeue import AsyncFile as AsyncQueue

__all__ = ["AsyncQueue"]
