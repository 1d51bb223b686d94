"""TransferQueue 0.1.11 (the ``transferqueue`` extra) as a peer in ``bench arena`` and ``bench samples``: a small
local Ray cluster, TransferQueue's controller and storage started on it the way its ``transfer_queue.init(conf)``
does (Ray actors: ``TransferQueueController`` and ``SimpleStorageUnit``, reached over ZeroMQ TCP), and worker
processes that attach to them (``ray.init(address=...)`` then ``transfer_queue.init()``, which finds the named
controller and makes this process's ``TransferQueueClient``).

Ray is started small for this 2-core machine: ``num_cpus=2`` (logical), a 300 MB object store (TransferQueue's
SimpleStorage keeps its data in its actors' memory, not in Ray's object store), no dashboard. TransferQueue's
controller and each storage unit ask Ray for one CPU each, so one storage unit fits beside the controller (its
default of 2 units would wait forever for a third CPU). Everything is shut down when the bench is done.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

RAY_NUM_CPUS = 2
RAY_OBJECT_STORE_BYTES = 300 * 1000**2
TQ_STORAGE_UNITS = 1  # the controller and each unit take one of Ray's logical CPUs
TQ_VERSION = "0.1.11"
TQ_SETTINGS = (
    f"Ray (num_cpus={RAY_NUM_CPUS}, object store {RAY_OBJECT_STORE_BYTES // 1000**2} MB, no dashboard), "
    f"transfer_queue.init: SimpleStorage with {TQ_STORAGE_UNITS} storage unit, controller polling_mode=True"
)


def tq_missing() -> str | None:
    """Why TransferQueue cannot run here (None: it can)."""
    try:
        import ray  # noqa: F401
        import tensordict  # noqa: F401
        import transfer_queue
    except ImportError as exc:
        return (
            f"not measured: {exc.name} is not installed (the transferqueue extra: pip install '.[transferqueue]' "
            "in a checkout)"
        )
    version = getattr(transfer_queue, "__version__", "?")
    if version != TQ_VERSION:
        return f"not measured: TransferQueue {version} is installed; this bench drives {TQ_VERSION}'s API"
    return None


def _quiet() -> None:
    # TransferQueue logs a warning per put on a 2-core machine (its thread cap); Ray's own logs go to its files.
    logging.getLogger("transfer_queue").setLevel(logging.ERROR)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("transfer_queue"):
            logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def tq_cluster(sampler: Any = None) -> Iterator[str]:
    """Ray and TransferQueue up in this process (``sampler``: a ``transfer_queue`` sampler instance for its
    controller, default SequentialSampler); yields the Ray address worker processes attach to."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(
        address="local",  # a cluster of our own even where another one runs on this machine (ray start, tests)
        num_cpus=RAY_NUM_CPUS,
        object_store_memory=RAY_OBJECT_STORE_BYTES,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    try:
        controller: dict[str, Any] = {"polling_mode": True}  # an empty answer instead of a 5 s wait and an error
        if sampler is not None:
            controller["sampler"] = sampler
        conf = OmegaConf.create(
            {"controller": controller, "backend": {"SimpleStorage": {"num_data_storage_units": TQ_STORAGE_UNITS}}},
            flags={"allow_objects": True},
        )
        tq.init(conf)
        _quiet()
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


def tq_attach(address: str) -> Any:
    """In a worker process: join the Ray cluster at ``address`` and return this process's TransferQueueClient."""
    import ray
    import transfer_queue as tq

    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    tq.init()  # finds the running controller: only makes the client
    _quiet()
    return tq.get_client()


def tq_detach(client: Any) -> None:
    """A worker's way out: close its client and leave Ray. Not ``transfer_queue.close()``, which would kill the
    controller that the process which started it owns."""
    import ray

    try:
        client.close()
    finally:
        ray.shutdown()
