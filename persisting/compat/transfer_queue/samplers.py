"""TransferQueue's sampler names over persisting's samplers (one interface: ``sample(ready_indexes, batch_size,
**kwargs) -> (sampled, consumed)``; the engine passes the ready samples positionally, so either name works).

``BaseSampler`` is TransferQueue's abstract base for custom samplers: subclass it and implement ``sample``. A
custom sampler runs where the engine runs: in embedded mode in-process; through the broker only the built-in
samplers run (nothing from the wire is unpickled), so ``get_meta`` with a custom sampler needs embedded mode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from persisting import GRPOGroupNSampler, LengthBalancedSampler, RankAwareSampler, SequentialSampler


class BaseSampler(ABC):
    def __init__(self) -> None:
        self._states: dict[Any, Any] = {}

    @abstractmethod
    def sample(
        self, ready_indexes: list[int], batch_size: int, *args: Any, **kwargs: Any
    ) -> tuple[list[int], list[int]]:
        """Pick ``batch_size`` of ``ready_indexes``: (sampled, consumed)."""

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
        return self.sample(*args, **kwargs)

    def clear_cache(self, partition_id: str) -> None:
        self._states.pop(partition_id, None)


# TransferQueue's name for the sampler that balances sequence lengths across data-parallel ranks.
SeqlenBalancedSampler = LengthBalancedSampler

__all__ = ["BaseSampler", "GRPOGroupNSampler", "RankAwareSampler", "SeqlenBalancedSampler", "SequentialSampler"]
