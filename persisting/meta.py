"""What ``put`` of a tensor batch returns and what ``get_meta`` hands to ``get_data``: plain, msgpack-safe.

A ``BatchMeta`` names samples (rows of the topic) by global index, within one partition, with each field's
kind, dtype and per-sample shape. It carries no payload and no pointer into shared memory: ``get_data`` asks the
broker for the bytes, so a meta can be sent to another process (``to_dict``/``from_dict``) and used there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidRecordError


@dataclass(frozen=True, slots=True)
class FieldMeta:
    name: str
    kind: str  # "ndarray" (numpy), "tensor" (torch) or a record kind ("int", "str", ...) for non-tensor fields
    dtype: str = ""  # numpy dtype str or torch dtype name; "" for non-tensor fields
    shape: tuple[int, ...] = ()  # per sample

    def to_list(self) -> list[Any]:
        return [self.name, self.kind, self.dtype, list(self.shape)]

    @classmethod
    def from_list(cls, raw: Any) -> FieldMeta:
        try:
            name, kind, dtype, shape = raw
            return cls(str(name), str(kind), str(dtype), tuple(int(d) for d in shape))
        except (TypeError, ValueError) as exc:
            raise InvalidRecordError(f"not a field meta: {raw!r}") from exc


@dataclass(frozen=True, slots=True)
class SampleMeta:
    global_index: int
    partition_id: str
    fields: dict[str, FieldMeta] = field(default_factory=dict)

    @property
    def field_names(self) -> list[str]:
        return list(self.fields)


@dataclass(frozen=True, slots=True)
class BatchMeta:
    samples: tuple[SampleMeta, ...] = ()
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def global_indexes(self) -> list[int]:
        return [s.global_index for s in self.samples]

    @property
    def partition_ids(self) -> list[str]:
        return sorted({s.partition_id for s in self.samples})

    @property
    def field_names(self) -> list[str]:
        names: dict[str, None] = {}
        for s in self.samples:
            names.update(dict.fromkeys(s.fields))
        return list(names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": [
                [s.global_index, s.partition_id, [f.to_list() for f in s.fields.values()]] for s in self.samples
            ],
            "extra_info": dict(self.extra_info),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> BatchMeta:
        try:
            samples = tuple(
                SampleMeta(int(index), str(partition), {f.name: f for f in map(FieldMeta.from_list, fields)})
                for index, partition, fields in raw["samples"]
            )
            return cls(samples, dict(raw.get("extra_info") or {}))
        except (TypeError, ValueError, KeyError) as exc:
            raise InvalidRecordError(f"not a BatchMeta dict: {exc}") from exc
