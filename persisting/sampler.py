"""``persisting.sampler``: where Persisting's users import the samplers from. They live in
``persisting.engine.samplers`` (the broker runs them); ``from persisting import RankAwareSampler`` works too."""

from .engine.samplers import (
    GRPOGroupNSampler,
    LengthBalancedSampler,
    PickSampler,
    RankAwareSampler,
    Sampler,
    SequentialSampler,
)

__all__ = [
    "GRPOGroupNSampler",
    "LengthBalancedSampler",
    "PickSampler",
    "RankAwareSampler",
    "Sampler",
    "SequentialSampler",
]
