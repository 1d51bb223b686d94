"""Page-locked (pinned) shared memory for CUDA copies: ``Queue(pin_memory=True)`` or ``PERSISTING_PIN_MEMORY=1``.

Off by default; then nothing here runs but ``resolve`` reading one environment variable, and torch is not
imported. On, every client mapping of the broker's shared memory that is MAP_SHARED is registered with CUDA
(``cudaHostRegister``, through torch), so copies between it and a GPU are DMA at pinned-memory speed instead of
the driver's staged copy of pageable memory. What is pinned, and why only that (docs/guides/tensors.md, "GPUs:
pinned shared memory")::

    segment file (tmpfs pages)
      ◀── MAP_SHARED, one per process and segment (segment.py ``_shared``): PINNED, whole, once, when it is made
      │   (segment 0 at the Queue's open, others at their first use); unpinned in ``Segment.close`` before the
      │   munmap. Producers write there: ``put`` copies into it, a reservation's ``copy_`` from a GPU tensor is
      │   a DMA straight into the broker's memory. Consumers read there with ``get_data(device="cuda")``: a DMA
      │   from the shared pages to the GPU, a stream sync, then the hold goes back (the result is device memory,
      │   the consumer's own, so copy-on-write is not needed for isolation)
      └── MAP_PRIVATE, one per get_data call without a device: NEVER pinned

Why not the private mappings: registration pins the pages for writing (unless registered read-only), and a pin
for writing in a MAP_PRIVATE mapping breaks copy-on-write of every page: a full copy of the batch into the
consumer's memory, the zero copy gone. A read-only registration would keep reading the file's page after the
consumer wrote its own copy. And each call would pay a register and an unregister (the driver locks and maps
every page) for one copy.

The registration is portable (``cudaHostRegisterPortable``): pinned for every CUDA context of the process, so a
process that drives several GPUs gets DMA to each. It runs on the current CUDA device: a process that drives one
GPU other than 0 sets it first (``torch.cuda.set_device``) or the registration creates a context on device 0.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..errors import ConfigError

log = logging.getLogger(__name__)

ENV = "PERSISTING_PIN_MEMORY"
_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context of the process, not only the current one
_OFF_HOW = f"pass pin_memory=False (or unset {ENV})"


def resolve(option: bool | None) -> bool:
    """Whether a Queue pins: its ``pin_memory`` argument, else ``PERSISTING_PIN_MEMORY`` (``1``: on; ``0`` or
    unset: off). On, torch with a usable GPU is checked now, so a machine without one fails where the option is
    turned on (the Queue's construction), not in some later put."""
    if option is None:
        raw = os.environ.get(ENV, "")
        if raw not in ("", "0", "1"):
            raise ConfigError(f"{ENV} must be 1 (pin the shared memory for CUDA) or 0 (do not), got {raw!r}")
        if raw == "1":
            check_cuda(f"{ENV}=1")
        return raw == "1"
    if not isinstance(option, bool):
        raise ConfigError(f"pin_memory must be True, False or None (None: {ENV} decides), got {option!r}")
    if option:
        check_cuda("pin_memory=True")
    return option


def check_cuda(source: str) -> None:
    """``ConfigError`` naming what is missing (torch, a CUDA build, a visible GPU) and how to fix it."""
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(
            f"{source} page-locks the broker's shared memory for CUDA through torch, and torch is not installed; "
            f"install a CUDA build of torch, or {_OFF_HOW}"
        ) from exc
    if torch.cuda.is_available():
        return
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        why, fix = f"torch {torch.__version__} is a CPU-only build", "install a CUDA build of torch"
    else:
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU"
        fix = "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
    raise ConfigError(f"{source} page-locks the broker's shared memory for CUDA, but {why}; {fix}, or {_OFF_HOW}")


class Pin:
    """One registered range, from ``register`` until ``unregister`` (which must come before its munmap)."""

    __slots__ = ("address", "nbytes", "what")

    def __init__(self, address: int, nbytes: int, what: str) -> None:
        self.address = address
        self.nbytes = nbytes
        self.what = what


def _cudart() -> Any:
    """torch's binding of the CUDA runtime (initialises CUDA in this process); tests replace it."""
    import torch

    return torch.cuda.cudart()


def _error_text(cudart: Any, code: int) -> str:
    try:
        return str(cudart.cudaGetErrorString(cudart.cudaError(code)))
    except Exception:  # an older binding without these names: the code alone
        return "CUDA error"


def register(address: int, nbytes: int, what: str) -> Pin:
    """Page-lock ``[address, address + nbytes)`` (a whole mapping) for CUDA; ``ConfigError`` if the driver
    refuses, with its reason. Costs a walk of every page (locked and mapped for the GPU), once per mapping."""
    cudart = _cudart()
    code = int(cudart.cudaHostRegister(address, nbytes, _PORTABLE))
    if code != 0:
        raise ConfigError(
            f"cannot page-lock {what} ({nbytes} bytes) for CUDA: {_error_text(cudart, code)} ({code}); it can "
            f"be used unpinned: {_OFF_HOW}"
        )
    return Pin(address, nbytes, what)


def unregister(pin: Pin) -> None:
    """Unlock a range ``register`` locked; call it before the range is unmapped (the driver would keep the pages
    of a range that is gone, and a later mapping at that address could not be registered). From ``close``, so a
    failure is logged, not raised."""
    cudart = _cudart()
    code = int(cudart.cudaHostUnregister(pin.address))
    if code != 0:
        log.warning("cudaHostUnregister of %s failed: %s (%d)", pin.what, _error_text(cudart, code), code)


# -- the consumer's side: get_data(device="cuda") from the pinned shared mapping ----------------------------


def is_cuda(device: Any) -> bool:
    """Whether ``device`` (a ``get_data`` argument: "cuda:0", a ``torch.device``, None) names a CUDA device."""
    if device is None:
        return False
    import torch

    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError, ValueError):
        return False  # not a device torch knows: to_user's .to() raises torch's own error


def wait(device: Any) -> None:
    """Wait for the copies queued (non-blocking) on ``device``'s current stream: their source, the shared
    mapping, may be reused by the broker once the hold goes back."""
    import torch

    torch.cuda.current_stream(torch.device(device)).synchronize()


def cat(parts: list[Any]) -> Any:
    """Samples of several puts, each copied to the device already, as one tensor (joined on the device, not in
    host memory first)."""
    import torch

    return torch.cat(parts)
