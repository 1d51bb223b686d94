"""TransferQueue 0.1.11's ``BatchMeta`` and ``KVBatchMeta``, with its semantics (read from its ``metadata.py``).

Unlike persisting's own immutable ``persisting.BatchMeta``, TransferQueue's metas are mutable: verl assigns
``meta.extra_info = {...}``, calls ``update_custom_meta`` and ``KVBatchMeta.reorder`` in place, builds
``BatchMeta()`` with no argument for "nothing to collect", and sends metas between Ray workers by pickle.
These are plain Python objects with no pointer to any process: pickling one is safe across processes.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections import defaultdict
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

READY_FOR_CONSUME = 1


def _values_equal(a: Any, b: Any) -> bool:
    try:
        import torch

        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and bool(torch.equal(a, b))
    except ImportError:  # pragma: no cover - torch is a dependency of every TransferQueue user
        pass
    try:
        return bool(a == b)
    except Exception:  # an object whose == does not give a bool (numpy arrays): compare by identity
        return a is b


def field_schema_of(data: Any) -> dict[str, dict[str, Any]]:
    """Per-field schema of a TensorDict as TransferQueue records it (dtype, per-sample shape, nested, non-tensor)."""
    import torch

    schema: dict[str, dict[str, Any]] = {}
    n = data.batch_size[0] if len(data.batch_size) else 0
    if n == 0:
        return schema
    for name, value in data.items():
        is_tensor = isinstance(value, torch.Tensor)
        nested = is_tensor and value.is_nested
        meta: dict[str, Any] = {"dtype": None, "shape": None, "is_nested": nested, "is_non_tensor": not is_tensor}
        if nested:
            parts = value.unbind()
            meta.update(dtype=value.dtype, shape=parts[0].shape, per_sample_shapes=[tuple(t.shape) for t in parts])
        elif is_tensor:
            meta.update(dtype=value.dtype, shape=(value[0].shape if value.dim() > 1 else torch.Size([1])))
        schema[name] = meta
    return schema


class BatchMeta:
    """Metadata of a batch of samples: global indexes, partitions, field schema, production status, tags."""

    def __init__(
        self,
        global_indexes: list[int] | None = None,
        partition_ids: list[str] | None = None,
        field_schema: dict[str, dict[str, Any]] | None = None,
        production_status: Any = None,
        extra_info: dict[str, Any] | None = None,
        custom_meta: list[dict[str, Any]] | None = None,
        _custom_backend_meta: list[dict[str, Any]] | None = None,
    ) -> None:
        self.global_indexes = list(global_indexes or [])
        self.partition_ids = list(partition_ids or [])
        if len(self.global_indexes) != len(self.partition_ids):
            raise ValueError(
                f"Length mismatch: global_indexes has {len(self.global_indexes)}, "
                f"partition_ids has {len(self.partition_ids)}"
            )
        n = len(self.global_indexes)
        self.field_schema = {k: dict(v) for k, v in (field_schema or {}).items()}
        self.extra_info = dict(extra_info or {})
        if production_status is None:
            self.production_status = np.zeros(n, dtype=np.int8)
        else:
            self.production_status = np.array(production_status, dtype=np.int8, copy=True)
            if len(self.production_status) != n:
                raise ValueError(f"production_status length {len(self.production_status)} != batch_size {n}")
        self.custom_meta = [dict(d) for d in custom_meta] if custom_meta else [{} for _ in range(n)]
        if len(self.custom_meta) != n:
            raise ValueError(f"custom_meta length {len(self.custom_meta)} != batch_size {n}")
        backend = _custom_backend_meta
        self._custom_backend_meta = [dict(d) for d in backend] if backend else [{} for _ in range(n)]

    # -- properties ---------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.global_indexes)

    @property
    def field_names(self) -> list[str]:
        return sorted(self.field_schema)

    @property
    def is_ready(self) -> bool:
        return self.size > 0 and bool(np.all(self.production_status == READY_FOR_CONSUME))

    def __len__(self) -> int:
        return self.size

    def __str__(self) -> str:
        return (
            f"BatchMeta(size={self.size}, field_names={self.field_names}, is_ready={self.is_ready}, "
            f"global_indexes={self.global_indexes}, extra_info={self.extra_info})"
        )

    __repr__ = __str__

    def get_dtypes(self, field_name: str) -> list[Any]:
        return [self.field_schema.get(field_name, {}).get("dtype")] * self.size

    def get_shapes(self, field_name: str) -> list[Any]:
        meta = self.field_schema.get(field_name, {})
        per = meta.get("per_sample_shapes")
        return list(per) if per is not None else [meta.get("shape")] * self.size

    # -- extra_info (batch level) and custom_meta (per sample) ---------------------------------------
    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return self.extra_info.get(key, default)

    def set_extra_info(self, key: str, value: Any) -> None:
        self.extra_info[key] = value

    def get_all_extra_info(self) -> dict[str, Any]:
        return copy.deepcopy(self.extra_info)

    def update_extra_info(self, info_dict: dict[str, Any]) -> None:
        self.extra_info.update(info_dict)

    def remove_extra_info(self, key: str) -> Any:
        return self.extra_info.pop(key, None)

    def clear_extra_info(self) -> None:
        self.extra_info.clear()

    def has_extra_info(self, key: str) -> bool:
        return key in self.extra_info

    def get_all_custom_meta(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.custom_meta)

    def update_custom_meta(self, custom_meta: list[dict[str, Any]] | None) -> None:
        """Merge one dict per sample into its tags (``dict.update``: keys not given keep their value)."""
        if custom_meta is None:
            return
        if len(custom_meta) != self.size:
            raise ValueError(
                f"The length of custom_meta list {len(custom_meta)} must match the batch size: {self.size}"
            )
        for mine, new in zip(self.custom_meta, custom_meta, strict=True):
            mine.update(new)

    def clear_custom_meta(self) -> None:
        self.custom_meta = [{} for _ in range(self.size)]

    # -- operations ---------------------------------------------------------------------------------
    def add_fields(self, tensor_dict: Any, set_all_ready: bool = True) -> BatchMeta:
        n = tensor_dict.batch_size[0]
        if n == 0:
            return self
        if n != self.size:
            raise ValueError(f"add_fields batch size mismatch: self.size={self.size} vs tensor_dict={n}")
        self.field_schema.update(field_schema_of(tensor_dict))
        if set_all_ready:
            self.production_status[:] = READY_FOR_CONSUME
        return self

    def select_samples(self, sample_indices: list[int]) -> BatchMeta:
        if any(i < 0 or i >= self.size for i in sample_indices):
            raise ValueError(f"Sample indices must be in range [0, {self.size})")
        schema = {}
        for name, meta in self.field_schema.items():
            new = copy.deepcopy(meta)
            if meta.get("per_sample_shapes") is not None:
                new["per_sample_shapes"] = [meta["per_sample_shapes"][i] for i in sample_indices]
            schema[name] = new
        return BatchMeta(
            [self.global_indexes[i] for i in sample_indices],
            [self.partition_ids[i] for i in sample_indices],
            schema,
            self.production_status[list(sample_indices)],
            self.extra_info,
            [copy.deepcopy(self.custom_meta[i]) for i in sample_indices],
            [copy.deepcopy(self._custom_backend_meta[i]) for i in sample_indices],
        )

    def select_fields(self, field_names: list[str]) -> BatchMeta:
        """The same samples with only those of ``field_names`` the meta has (others are dropped silently)."""
        schema = {f: copy.deepcopy(self.field_schema[f]) for f in field_names if f in self.field_schema}
        return BatchMeta(
            self.global_indexes,
            self.partition_ids,
            schema,
            self.production_status.copy(),
            copy.deepcopy(self.extra_info),
            copy.deepcopy(self.custom_meta),
            [{f: v for f, v in m.items() if f.startswith("_") or f in field_names} for m in self._custom_backend_meta],
        )

    def copy(self) -> BatchMeta:
        return BatchMeta(
            list(self.global_indexes),
            list(self.partition_ids),
            copy.deepcopy(self.field_schema),
            self.production_status.copy(),
            copy.deepcopy(self.extra_info),
            copy.deepcopy(self.custom_meta),
            copy.deepcopy(self._custom_backend_meta),
        )

    def __getitem__(self, item: Any) -> BatchMeta:
        if isinstance(item, int | np.integer):
            i = int(item) + (self.size if item < 0 else 0)
            if not 0 <= i < self.size:
                raise IndexError("BatchMeta index out of range")
            return self.select_samples([i])
        if isinstance(item, slice):
            return self.select_samples(list(range(*item.indices(self.size))))
        raise TypeError(f"Indexing with {type(item)} is not supported.")

    def chunk(self, chunks: int) -> list[BatchMeta]:
        """``chunks`` metas of consecutive samples; the first ``size % chunks`` get one more."""
        base, extra = divmod(self.size, chunks)
        out, start = [], 0
        for i in range(chunks):
            stop = start + base + (1 if i < extra else 0)
            out.append(self.select_samples(list(range(start, stop))))
            start = stop
        return out

    def chunk_by_partition(self) -> list[BatchMeta]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, p in enumerate(self.partition_ids):
            groups[p].append(i)
        return [self.select_samples(idx) for idx in groups.values()]

    def union(self, other: BatchMeta) -> BatchMeta:
        if not other or other.size == 0:
            return self.copy()
        if self.size == 0:
            return other.copy()
        if self.global_indexes != other.global_indexes:
            raise ValueError("BatchMeta.union: global_indexes do not match.")
        if self.partition_ids != other.partition_ids:
            raise ValueError("BatchMeta.union: partition_ids do not match.")
        schema = copy.deepcopy(self.field_schema)
        schema.update(copy.deepcopy(other.field_schema))
        tags = [{**a, **b} for a, b in zip(self.custom_meta, other.custom_meta, strict=True)]
        backend = [{**a, **b} for a, b in zip(self._custom_backend_meta, other._custom_backend_meta, strict=True)]
        return BatchMeta(
            list(self.global_indexes),
            list(self.partition_ids),
            schema,
            np.bitwise_and(self.production_status, other.production_status),
            {**self.extra_info, **other.extra_info},
            copy.deepcopy(tags),
            copy.deepcopy(backend),
        )

    @classmethod
    def concat(cls, data: list[BatchMeta], validate: bool = True) -> BatchMeta:
        """The samples of every non-empty meta in order; field names must agree (``validate``); extra_info
        merged, a key with different values in two chunks is a ValueError."""
        data = [m for m in data or [] if m and m.size > 0]
        if not data:
            return cls.empty()
        if validate:
            names = data[0].field_names
            for m in data[1:]:
                if m.field_names != names:
                    raise ValueError(f"Field names do not match for concatenation: {names} vs {m.field_names}")
        schema: dict[str, dict[str, Any]] = {}
        for name in data[0].field_schema:
            meta = copy.deepcopy(data[0].field_schema[name])
            if any(m.field_schema.get(name, {}).get("per_sample_shapes") is not None for m in data):
                meta["per_sample_shapes"] = [s for m in data for s in m.get_shapes(name)]
            schema[name] = meta
        extra: dict[str, Any] = {}
        for m in data:
            for k, v in m.extra_info.items():
                if k in extra and not _values_equal(extra[k], v):
                    raise ValueError(f"BatchMeta.concat: extra_info key '{k}' has conflicting values across chunks.")
                extra.setdefault(k, v)
        return cls(
            [i for m in data for i in m.global_indexes],
            [p for m in data for p in m.partition_ids],
            schema,
            np.concatenate([m.production_status for m in data]),
            extra,
            [copy.deepcopy(t) for m in data for t in m.custom_meta],
            [copy.deepcopy(t) for m in data for t in m._custom_backend_meta],
        )

    def reorder(self, indices: list[int]) -> None:
        if sorted(indices) != list(range(self.size)):
            raise ValueError(f"reorder needs a permutation of range({self.size}), got {indices}")
        new = self.select_samples(list(indices))
        self.__dict__.update(new.__dict__)

    @classmethod
    def empty(cls, extra_info: dict[str, Any] | None = None) -> BatchMeta:
        return cls(extra_info=extra_info)


@dataclasses.dataclass
class KVBatchMeta:
    """Keys, their tags, the partition and the fields of a KV batch (TransferQueue's dataclass)."""

    keys: list[str] = dataclasses.field(default_factory=list)
    tags: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    partition_id: str | None = None
    fields: list[str] | None = None
    extra_info: dict[str, Any] | None = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.tags):
            raise ValueError(f"keys and tags must have same length, but got {len(self.keys)} and {len(self.tags)}")
        if len(self.keys) != len(set(self.keys)):
            raise ValueError("Got duplicated keys.")
        if self.fields is not None and len(self.fields) != len(set(self.fields)):
            raise ValueError("Got duplicated fields.")
        self.tags = copy.deepcopy(self.tags)
        self.extra_info = copy.deepcopy(self.extra_info)

    @property
    def size(self) -> int:
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __str__(self) -> str:
        return f"KVBatchMeta(size={self.size}, field_names={self.fields}, extra_info={self.extra_info})"

    def select_keys(self, keys_to_select: list[str]) -> KVBatchMeta:
        if len(set(keys_to_select)) != len(keys_to_select):
            raise ValueError("Contain duplicate keys.")
        missing = set(keys_to_select) - set(self.keys)
        if missing:
            raise RuntimeError(f"Keys {missing} not found in current batch.")
        at = {k: i for i, k in enumerate(self.keys)}
        return KVBatchMeta(
            list(keys_to_select), [self.tags[at[k]] for k in keys_to_select], self.partition_id, self.fields,
            self.extra_info,
        )  # fmt: skip

    def reorder(self, indexes: list[int]) -> None:
        if len(indexes) != self.size:
            raise ValueError(
                f"Attempted to reorder with indexes length {len(indexes)} that does not match "
                f"the batch size {self.size}."
            )
        if len(set(indexes)) != len(indexes):
            raise ValueError("Contain duplicate indexes.")
        self.keys = [self.keys[i] for i in indexes]
        self.tags = [self.tags[i] for i in indexes]

    def chunk(self, chunks: int) -> list[KVBatchMeta]:
        base, extra = divmod(self.size, chunks)
        out, start = [], 0
        for i in range(chunks):
            stop = start + base + (1 if i < extra else 0)
            out.append(
                KVBatchMeta(
                    self.keys[start:stop], self.tags[start:stop], self.partition_id, self.fields, self.extra_info
                )
            )
            start = stop
        return out

    @classmethod
    def concat(cls, data: list[KVBatchMeta]) -> KVBatchMeta:
        data = [m for m in data or [] if m and m.size > 0]
        if not data:
            return cls()
        base_fields = data[0].fields
        base_partition = data[0].partition_id
        for m in data:
            if m.fields is not None and set(m.fields) != set(base_fields or ()):
                raise ValueError("Field names do not match for concatenation.")
            if m.partition_id != base_partition:
                raise ValueError("Partition do not match for concatenation.")
        extra: dict[str, Any] = {}
        for m in data:
            for k, v in (m.extra_info or {}).items():
                if k in extra and not _values_equal(extra[k], v):
                    raise ValueError(f"KVBatchMeta.concat: extra_info key '{k}' has conflicting values across chunks.")
                extra.setdefault(k, v)
        return cls(
            [k for m in data for k in m.keys],
            [t for m in data for t in m.tags],
            base_partition,
            base_fields,
            extra or None,
        )
