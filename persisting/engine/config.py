"""A topic's settings and counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

DURABILITY_MODES = ("sync", "process")


@dataclass(slots=True)
class Metrics:
    puts: int = 0
    records_put: int = 0
    gets: int = 0
    records_read: int = 0
    flushes: int = 0
    records_flushed: int = 0
    flush_seconds: float = 0.0
    commit_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class TopicConfig:
    num_buckets: int = 4
    bucket_column: str = "id"
    batch_size: int = 100
    auto_flush_interval_sec: float = 0.0
    durability: str = "sync"
    backend_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if not isinstance(self.num_buckets, int) or not 1 <= self.num_buckets <= 4096:
            raise ConfigError(f"num_buckets must be an int from 1 to 4096, got {self.num_buckets!r}")
        if not isinstance(self.bucket_column, str) or not self.bucket_column:
            raise ConfigError(f"bucket_column must be a non-empty str, got {self.bucket_column!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {self.batch_size!r}")
        if not isinstance(self.auto_flush_interval_sec, int | float) or self.auto_flush_interval_sec < 0:
            raise ConfigError(
                f"auto_flush_interval_sec must be a number >= 0 (0 disables it), got {self.auto_flush_interval_sec!r}"
            )
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability must be one of {DURABILITY_MODES}, got {self.durability!r}")
