"""Samplers: which of the ready samples a ``get_meta`` call hands out.

The protocol (a custom sampler implements it)::

    sample(ready, batch_size, **kw) -> (sampled, consumed)

``ready`` lists the global indexes of the samples this task may still take in the partition, in index order;
``kw`` carries ``positions`` (each ready sample's position in its partition: 0 for the first sample ever put
there) plus what the caller passed (``dp_rank``, ``batch_index``, ...). ``sampled`` goes into the BatchMeta;
``consumed`` is marked taken for the task (consume-on-fetch), usually the same list. A sampler that cannot fill
a whole batch returns what it can: ``get_meta(wait=True)`` waits until it fills one.

Built-in samplers work in embedded and broker mode (the broker rebuilds them from ``to_wire()``); a custom
sampler works in embedded mode only, because nothing from the wire is unpickled.

``RankAwareSampler``: every rank of one data-parallel group asking for the same (partition, task, dp_rank,
batch_index) gets the identical batch; different dp_rank values get disjoint samples. The engine remembers the
answer per key (``cache_key``), so the first rank's request samples and the others read it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigError

RANK_CACHE_SIZE = 4096  # (partition, task, dp_rank, batch_index) answers remembered per topic


@runtime_checkable
class Sampler(Protocol):
    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]: ...


class SequentialSampler:
    """The first ``batch_size`` ready samples, in index order."""

    name = "sequential"

    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        picked = list(ready[:batch_size])
        return picked, picked

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name}

    def cache_key(self, **kw: Any) -> tuple[Any, ...] | None:
        return None


class RankAwareSampler(SequentialSampler):
    """Sequential, and the same batch for every rank asking with the same ``dp_rank`` and ``batch_index``."""

    name = "rank_aware"

    def cache_key(self, **kw: Any) -> tuple[Any, ...] | None:
        dp_rank, batch_index = kw.get("dp_rank"), kw.get("batch_index")
        for label, value in (("dp_rank", dp_rank), ("batch_index", batch_index)):
            if type(value) is not int or value < 0:
                raise ConfigError(f"RankAwareSampler needs {label}= an int >= 0, got {value!r}")
        return (dp_rank, batch_index)


class GRPOGroupNSampler:
    """Whole groups of ``n_samples_per_prompt`` (the n responses of one prompt, put together), never split.

    A group is ``n`` consecutive samples of the partition: positions ``[k*n, (k+1)*n)``; put each prompt's
    responses in one put, in puts whose sizes are multiples of n. A group is handed out once all its samples
    are ready; ``batch_size`` must be a multiple of n.
    """

    name = "grpo"

    def __init__(self, n_samples_per_prompt: int) -> None:
        if type(n_samples_per_prompt) is not int or n_samples_per_prompt < 1:
            raise ConfigError(f"n_samples_per_prompt must be an int >= 1, got {n_samples_per_prompt!r}")
        self.n = n_samples_per_prompt

    def sample(self, ready: Sequence[int], batch_size: int, **kw: Any) -> tuple[list[int], list[int]]:
        if batch_size % self.n:
            raise ConfigError(
                f"batch_size {batch_size} is not a multiple of n_samples_per_prompt={self.n}: a batch holds whole "
                "groups only"
            )
        positions: Sequence[int] = kw["positions"]
        picked: list[int] = []
        k = 0
        while k < len(ready) and len(picked) < batch_size:
            start = positions[k]
            if start % self.n == 0 and k + self.n <= len(ready) and positions[k + self.n - 1] == start + self.n - 1:
                picked.extend(ready[k : k + self.n])  # all n of the group are ready (positions are consecutive)
                k += self.n
            else:
                k += 1  # a group that is not whole yet (or was split by a put of the wrong size): skip it
        return picked, picked

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "n": self.n}

    def cache_key(self, **kw: Any) -> tuple[Any, ...] | None:
        return None


def from_wire(raw: Any) -> SequentialSampler | GRPOGroupNSampler:
    """A built-in sampler from its ``to_wire()`` form (what the broker accepts)."""
    if raw is None:
        return SequentialSampler()
    if not isinstance(raw, dict):
        raise ConfigError(f"not a sampler description: {raw!r}")
    name = raw.get("name")
    if name == "sequential":
        return SequentialSampler()
    if name == "rank_aware":
        return RankAwareSampler()
    if name == "grpo":
        return GRPOGroupNSampler(raw.get("n"))  # type: ignore[arg-type]
    raise ConfigError(f"unknown sampler {name!r}; the broker knows sequential, rank_aware and grpo")
