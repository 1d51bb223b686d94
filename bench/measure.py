"""What every benchmark measures with: nearest-rank percentiles and the progress callback (``Tick``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Tick = Callable[[int], None]  # advance the progress bar by this many units (records, batches, calls)


def nearest_rank(sorted_samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of ascending ``sorted_samples``, by nearest rank: always a measured value."""
    return sorted_samples[max(0, math.ceil(q * len(sorted_samples)) - 1)]
