"""What the ``torch.multiprocessing.Queue`` references put (the ``arena`` and ``sizes`` suites): a tensor copied
once, straight into shared memory. torch is imported when a copy is made: the suites run without it otherwise."""

from __future__ import annotations

from typing import Any


def shared_copy(t: Any) -> Any:
    """A fresh ``share_memory_()`` tensor of ``t``'s shape with ``t`` copied in (one copy, into shared memory)."""
    import torch

    buf = torch.empty(t.shape, dtype=t.dtype).share_memory_()
    buf.copy_(t)
    return buf
