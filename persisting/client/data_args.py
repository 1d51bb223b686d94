"""The data API's argument checks (``data_api.DataAPI``): bad input is refused here, in the caller's thread,
with a ConfigError naming what was wrong, before it reaches an engine or the wire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engine import samplers
from ..errors import ConfigError


def field_list(fields: Any, where: str) -> list[str] | None:
    """A list of field names (None stays None); one str is refused: ``"ab"`` would read as ``["a", "b"]``."""
    if fields is None:
        return None
    if type(fields) is list and all(type(f) is str and f for f in fields):
        return list(fields)  # the usual form, without the ABC checks below (get_meta pays this per call)
    if isinstance(fields, str | bytes) or not isinstance(fields, Sequence | set | frozenset | dict):
        raise ConfigError(
            f"{where}: fields must be a list of field names, e.g. [{fields!r:.60}], got {type(fields).__qualname__} "
            f"{fields!r:.60}"
        )
    names = list(fields)
    bad = [f for f in names if not isinstance(f, str) or not f]
    if bad:
        raise ConfigError(f"{where}: field names must be non-empty str, got {bad[0]!r:.60}")
    return names


TAG_TYPES = "str, int, float, bool, None, bytes, and lists and dicts (with str keys) of them"


def check_tags(index: int, tags: Any) -> None:
    """Tags travel and are stored as msgpack: refuse a value it cannot carry, naming the tag (same in both modes)."""
    for key, value in tags.items():
        if not isinstance(key, str):
            raise ConfigError(
                f"sample {index}: tag names must be str, got {key!r:.60}; tags must be msgpack-safe: {TAG_TYPES}"
            )
        problem = _untaggable(value)
        if problem is not None:
            raise ConfigError(
                f"sample {index}: tag {key!r} holds {problem}, which cannot be stored; "
                f"tags must be msgpack-safe: {TAG_TYPES}"
            )


def _untaggable(value: Any) -> str | None:
    """What in ``value`` a tag cannot hold (None: it is fine)."""
    if value is None or isinstance(value, bool | float | str | bytes):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else f"the int {value}, outside 64 bits"
    if isinstance(value, list | tuple):
        return next((p for p in map(_untaggable, value) if p is not None), None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"a dict key of type {type(k).__qualname__}"
            problem = _untaggable(v)
            if problem is not None:
                return problem
        return None
    return f"a {type(value).__qualname__}"


def lease_of(delivery: Any, lease_seconds: Any) -> float | None:
    """The lease of acknowledged delivery, None for consume-on-fetch."""
    if delivery == "fetch":
        return None
    if delivery != "ack":
        raise ConfigError(f"delivery must be 'fetch' (consume-on-fetch) or 'ack' (leases), got {delivery!r}")
    if not isinstance(lease_seconds, int | float) or isinstance(lease_seconds, bool) or lease_seconds <= 0:
        raise ConfigError(f"lease_seconds must be a number > 0, got {lease_seconds!r}")
    return float(lease_seconds)


def sampler_kw(dp_rank: Any, batch_index: Any) -> dict[str, int]:
    kw = {}
    for label, value in (("dp_rank", dp_rank), ("batch_index", batch_index)):
        if value is not None:
            if type(value) is not int or value < 0:
                raise ConfigError(f"{label} must be an int >= 0, got {value!r}")
            kw[label] = value
    return kw


def check_sampler(sampler: Any) -> None:
    # The built-in samplers pass without the Protocol's isinstance, which walks the protocol's attributes on
    # every call (~10 us: as much as the rest of get_meta's argument checks together).
    if sampler is None or type(sampler).__module__ == samplers.__name__:
        return
    if not isinstance(sampler, samplers.Sampler):
        raise ConfigError(
            "sampler must have sample(ready, batch_size, **kw) -> (sampled, consumed); "
            f"got {type(sampler).__qualname__}"
        )


def sampler_wire(sampler: Any) -> dict[str, Any] | None:
    """A sampler as the broker rebuilds it: built-in ones only (nothing from the wire is unpickled)."""
    check_sampler(sampler)
    if sampler is None:
        return None
    to_wire = getattr(sampler, "to_wire", None)
    if type(sampler).__module__ != samplers.__name__ or to_wire is None:
        raise ConfigError(
            f"{type(sampler).__qualname__} is a custom sampler: it works in embedded mode only, the broker runs "
            "the built-in ones (Sequential, RankAware, GRPOGroupN and LengthBalanced samplers)"
        )
    wire: dict[str, Any] = to_wire()
    return wire
