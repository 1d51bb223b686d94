"""The engine's rules on what it is given and a helper on what it answers, which need none of its state: a
broker-mode client applies them before a request leaves, without loading the engine (``engine/__init__.py``
loads each part on first use).

Keys of keyed samples (``keys.KeyIndex``) and idempotency keys of puts (``puts.Appender``) are checked here, by
the client and again by the engine (the broker's requests come from any client); ``shared_fields`` reads the
runs of ``Topic.describe``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError

MAX_KEY_CHARS = 4096
MAX_IDEMPOTENCY_KEY_CHARS = 256


def check_key(key: object) -> None:
    """An idempotency key is a non-empty str of at most MAX_IDEMPOTENCY_KEY_CHARS (it rides in the log frame)."""
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        shown = repr(key)[:64]
        raise ConfigError(
            f"idempotency_key must be a non-empty str of at most {MAX_IDEMPOTENCY_KEY_CHARS} characters, got {shown}"
        )


def check_keys(keys: Any, tags: Any = None) -> list[str]:
    """Keys are a list of distinct non-empty str (one str is refused: it is not a list of keys)."""
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise ConfigError(f"keys must be a list of str, got {type(keys).__qualname__} {keys!r:.60}")
    bad = [k for k in keys if not isinstance(k, str) or not k or len(k) > MAX_KEY_CHARS]
    if bad:
        raise ConfigError(f"keys must be non-empty str of at most {MAX_KEY_CHARS} characters, got {bad[:3]!r:.200}")
    if len(set(keys)) != len(keys):
        raise ConfigError("a key appears twice in one call; name each key once")
    if tags is not None and (isinstance(tags, dict) or not isinstance(tags, Sequence) or len(tags) != len(keys)):
        raise ConfigError(f"tags must be a list of one dict per key ({len(keys)}), got {tags!r:.100}")
    return list(keys)


def shared_fields(runs: list[list[Any]]) -> list[str]:
    """The fields every sample of ``Topic.describe``'s runs has written, in the order the first run lists them."""
    if not runs:
        return []
    names = list(runs[0][1])
    for run in runs[1:]:
        names = [n for n in names if n in run[1]]
    return names
