"""Records to storage rows and back, exactly.

A *record* is what users put: a dict with non-empty ``str`` keys and values of these kinds::

    kind      Python values                          stored as (per row, in the WAL and in a backend)
    bool      bool                                   bool
    int       int (-2**63 .. 2**63-1)                int
    float     float                                  float
    str       str                                    str
    bytes     bytes, bytearray, memoryview           bytes          (read back as bytes)
    nested    list, tuple, dict (nested freely)      bytes (msgpack with extension types)
    ndarray   numpy.ndarray, numpy scalars           bytes (msgpack: dtype descr, shape, raw data)
    tensor    torch.Tensor (any device; bfloat16)    bytes (msgpack: torch dtype name, shape, raw data)
    jagged    one sample of a jagged nested tensor   bytes (msgpack: torch dtype name, shape, raw data, ragged
              (tensor batches only, tensors/jagged)         dimension)
    object    any Python object, pickled by the      bytes (the pickle; only with ``objects="pickle"``, see
              client (tensor batches, opt-in)               persisting/tensors/objects.py; never unpickled here)
    (none)    None                                   None

Every field keeps one kind for the life of a topic: the kind is fixed by the first value stored, and a value of
another kind is refused (``SchemaConflictError``) rather than coerced, because coercion breaks the exact round
trip (``1`` would come back as ``1.0``). ``None`` fits every field. Inside ``nested`` values tuples stay tuples,
numpy arrays keep dtype and shape, and dict keys may be ``str`` or ``int``. Sets, arbitrary objects and numpy
object arrays are refused: storing them would need pickle, and nothing read from disk or the wire is unpickled.

A *row* is the storage form: the same keys, values reduced to ``None/bool/int/float/str/bytes``. Rows are what
the write-ahead log and storage backends hold; ``decode_rows`` needs the topic's kinds to turn them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
import msgspec

from ..errors import CorruptionError, InvalidRecordError, ProtocolError, SchemaConflictError
from . import tensor_kinds

if TYPE_CHECKING:
    import numpy as np
else:
    from ..lazy_numpy import np  # imported at first use: a broker client of records never loads it


class Pickled:
    """A pickled value: what the codec stores for kind ``object`` (its bytes), and what a read gives back before
    the Queue decides whether to load it (``persisting/tensors/objects.py``: pickling happens only there)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Pickled({len(self.data)} bytes)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pickled) and other.data == self.data

    __hash__ = None  # type: ignore[assignment]


RESERVED_PREFIX = "_persisting_"
"""Keys with this prefix belong to the engine (global index, partition); users cannot put them."""
REF_SUFFIX = "@payload"
"""Fields with this suffix hold the references of deduped fields (tensors/dedup.py); users cannot put them."""
INDEX_KEY = "_persisting_index"  # the engine's columns in every backend: global index and partition
PARTITION_KEY = "_persisting_partition"
OF_KEY = "_persisting_of"  # a patch row: the sample whose fields it writes (engine/fields.py)
FIELDS_KEY = "_persisting_fields"  # the fields a row writes, as a JSON list


def reserved(name: str) -> str | None:
    """Why a user cannot put a field ``name`` (the rest of a sentence naming it), or None if it can."""
    if name.startswith(RESERVED_PREFIX):
        return f"starts with {RESERVED_PREFIX!r} (reserved for the queue's own fields)"
    if name.endswith(REF_SUFFIX):
        return f"ends with {REF_SUFFIX!r} (reserved for the queue: the references of deduped fields)"
    return None


def check_names(what: str, names: Iterable[str]) -> None:
    """Refuse field names a user cannot put (``reserved``) with ``InvalidRecordError`` naming the first."""
    for name in names:
        why = reserved(name)
        if why is not None:
            raise InvalidRecordError(f"{what} {name!r} {why}; rename it")


def check_partition(partition: Any) -> str:
    """A partition a user writes to: a non-empty str that does not start with ``RESERVED_PREFIX`` (the engine's
    own partitions, such as ``_persisting_payloads:<partition>``, where deduped fields' values lie)."""
    if not isinstance(partition, str) or not partition:
        raise InvalidRecordError(f"partition_id must be a non-empty str, got {partition!r}")
    if partition.startswith(RESERVED_PREFIX):
        raise InvalidRecordError(
            f"partition_id {partition!r} starts with {RESERVED_PREFIX!r} (reserved for the queue's own partitions); "
            "rename it"
        )
    return partition


INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_EXT_TUPLE = 1
_EXT_NDARRAY = 2
_EXT_NPSCALAR = 3
_EXT_TORCH = 4  # a torch tensor inside a nested value: [torch dtype name, shape, raw bytes]

_SCALAR_KINDS: dict[type, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
}
_SUPPORTED = (
    "bool, int, float, str, bytes, None, list, tuple, dict, numpy.ndarray, a numpy scalar or torch.Tensor "
    "(and, in tensor batches, jagged nested tensors, and any object with objects='pickle')"
)


class _Unstorable(Exception):
    """Raised inside msgpack's default hook; turned into InvalidRecordError with the field name."""


def _pack_array(arr: np.ndarray) -> list[Any]:
    if arr.dtype.hasobject:
        raise _Unstorable(
            "a numpy array of dtype object (it would need pickle); convert it to a numeric dtype or a list"
        )
    descr = np.lib.format.dtype_to_descr(arr.dtype)
    return [descr, list(arr.shape), np.ascontiguousarray(arr).tobytes()]


def _default(obj: Any) -> Any:
    # strict_types=True sends tuples and subclasses here, so types round-trip exactly.
    if isinstance(obj, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _packb(list(obj)))
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(_EXT_NDARRAY, _packb(_pack_array(obj)))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(_EXT_NPSCALAR, _packb(_pack_array(np.asarray(obj))))
    if tensor_kinds.claims(obj):
        if getattr(obj, "is_nested", False):
            raise _Unstorable("a nested tensor (put it as a field of a tensor batch)")
        dtype_name, host = tensor_kinds.registered().to_host(obj)
        return msgpack.ExtType(_EXT_TORCH, _packb([dtype_name, list(host.shape), host.tobytes()]))
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, list):
        return list(obj)
    if isinstance(obj, bytearray | memoryview):
        return bytes(obj)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    raise _Unstorable(f"a value of type {type(obj).__qualname__}")


def _packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)


def _unpack_array(data: bytes) -> np.ndarray:
    # _unpackb restores the tuples of a structured dtype's descr (they were packed as tuple extensions).
    descr, shape, raw = _unpackb(data)
    dtype = np.lib.format.descr_to_dtype(descr)
    # A writable copy: records are small, and users expect to own what get() returns.
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(_unpackb(data))
    if code == _EXT_NDARRAY:
        return _unpack_array(data)
    if code == _EXT_NPSCALAR:
        return _unpack_array(data)[()]
    if code == _EXT_TORCH:
        dtype_name, shape, raw = _unpackb(data)
        kinds = tensor_kinds.registered()
        host = np.frombuffer(raw, dtype=kinds.storage_dtype("tensor", dtype_name)).reshape(shape).copy()
        return kinds.to_user(host, "tensor", dtype_name)
    raise ValueError(f"unknown msgpack extension type {code}")


def _unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False, use_list=True)


def _check_nested_keys(obj: Any, field: str) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise InvalidRecordError(
                    f"field {field!r} contains a dict key of type {type(k).__qualname__} ({k!r}); "
                    "nested dict keys must be str or int"
                )
            _check_nested_keys(v, field)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _check_nested_keys(v, field)


def kind_of(value: Any, field: str) -> str:
    """The kind of one top-level value (``None`` has no kind and is not passed here)."""
    kind = _SCALAR_KINDS.get(type(value))
    if kind is not None:
        return kind
    if isinstance(value, np.ndarray | np.generic):
        return "ndarray"
    if isinstance(value, list | tuple | dict):
        return "nested"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes"
    if tensor_kinds.claims(value):
        return "tensor"
    if isinstance(value, Pickled):
        return "object"
    raise InvalidRecordError(
        f"field {field!r} holds a value of type {type(value).__qualname__}, which cannot be stored; "
        f"use one of: {_SUPPORTED}"
    )


def encode_value(value: Any, kind: str, field: str) -> Any:
    """The storage form of one top-level value of a known kind."""
    if kind == "int":
        if not INT64_MIN <= value <= INT64_MAX:
            raise InvalidRecordError(
                f"field {field!r} holds the int {value}, outside the 64-bit range; store it as a str"
            )
        return int(value)
    if kind in ("bool", "float", "str"):
        if kind == "str":
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidRecordError(
                    f"field {field!r} holds a str that is not valid UTF-8 ({exc.reason}); store it as bytes"
                ) from exc
        return _SCALAR_TYPES[kind](value)
    if kind == "bytes":
        return bytes(value)
    if kind == "object":
        return bytes(value.data)
    if kind == "nested":
        _check_nested_keys(value, field)
    if kind == "tensor":
        if getattr(value, "is_nested", False):
            raise InvalidRecordError(
                f"field {field!r} holds a nested tensor: put it as a field of a tensor batch "
                "(put({field: nt, ...}, partition_id=...)), where jagged tensors are stored as values + offsets"
            )
        dtype_name, host = tensor_kinds.registered().to_host(value)
        return encode_sample("tensor", dtype_name, host)
    try:
        return _packb(value)
    except _Unstorable as exc:
        raise InvalidRecordError(
            f"field {field!r} contains {exc}, which cannot be stored; use one of: {_SUPPORTED}"
        ) from None
    except (OverflowError, UnicodeEncodeError, ValueError, TypeError) as exc:
        raise InvalidRecordError(f"field {field!r} cannot be encoded: {exc}") from exc


_SCALAR_TYPES: dict[str, type] = {"bool": bool, "float": float, "str": str}


class EncodedBatch(NamedTuple):
    """Records reduced to rows, with the kind each field had in this batch (a tuple: made on every put, and a
    frozen dataclass costs more to make than the rest of a one-record batch's encoding)."""

    rows: list[dict[str, Any]]
    kinds: dict[str, str]


def encode_batch(
    records: Iterable[Mapping[str, Any]], known_kinds: Mapping[str, str], refs: bool = False
) -> EncodedBatch:
    """Validate and encode records. Raises before anything is stored, so a bad record leaves no trace.

    ``known_kinds`` is the topic's schema; it is only read, so a conflict with it is reported here. ``refs``: the
    records may hold ``REF_SUFFIX`` fields (a tensor batch's, whose own names its put checked: see ``reserved``).
    """
    rows: list[dict[str, Any]] = []
    kinds: dict[str, str] = {}
    where: dict[str, int] = {}
    for n, record in enumerate(records):
        if type(record) is not dict and not isinstance(record, Mapping):  # the ABC check only for what is no dict
            raise InvalidRecordError(
                f"record {n} is a {type(record).__qualname__}; records must be dicts with str keys"
            )
        row: dict[str, Any] = {}
        for key, value in record.items():
            if type(key) is not str:
                raise InvalidRecordError(
                    f"record {n} has a key of type {type(key).__qualname__} ({key!r}); record keys must be str"
                )
            seen = kinds.get(key)  # (a key of this batch with a value was checked by its first record)
            if seen is None and (not key or key.startswith(RESERVED_PREFIX) or (key.endswith(REF_SUFFIX) and not refs)):
                why = reserved(key) or "is empty (keys are non-empty str)"
                raise InvalidRecordError(f"record {n} has the key {key!r}, which {why}; rename it")
            if value is None:
                row[key] = None
                continue
            kind = kind_of(value, key)
            if seen is None:
                stored = known_kinds.get(key)
                if stored is not None and stored != kind:
                    raise SchemaConflictError(key, stored, kind)
                kinds[key] = kind
                where[key] = n
            elif seen != kind:
                raise SchemaConflictError(key, f"{seen} (record {where[key]} of this batch)", kind)
            row[key] = encode_value(value, kind, key)
        rows.append(row)
    return EncodedBatch(rows, kinds)


def decode_rows(rows: Iterable[Mapping[str, Any]], kinds: Mapping[str, str]) -> list[dict[str, Any]]:
    """The records the rows were made from. Internal keys are dropped."""
    packed = {key for key, kind in kinds.items() if kind == "nested" or kind == "ndarray"}
    torch_fields = {key for key, kind in kinds.items() if kind == "tensor" or kind == "jagged"}
    pickled = {key for key, kind in kinds.items() if kind == "object"}
    out: list[dict[str, Any]] = []
    for row in rows:
        # Scalars are stored as themselves: only internal keys go, only msgpack'ed kinds are decoded.
        record = {k: v for k, v in row.items() if not k.startswith(RESERVED_PREFIX)}
        for key in packed.intersection(record):
            if record[key] is not None:
                record[key] = _unpackb(record[key])
        for key in pickled.intersection(record):
            if record[key] is not None:
                record[key] = Pickled(record[key])  # loaded (or refused) by the Queue: see tensors/objects.py
        for key in torch_fields.intersection(record):
            if record[key] is not None:
                dtype_name, host = decode_sample(kinds[key], record[key])
                record[key] = tensor_kinds.registered().to_user(host, "tensor", dtype_name)
        out.append(record)
    return out


def encode_sample(kind: str, dtype_name: str, sample: np.ndarray, ragged: int = 0) -> bytes:
    """The stored value of one sample of a tensor field (``sample`` holds the storage dtype's bytes; ``ragged``:
    a jagged sample's ragged dimension)."""
    sample = np.asarray(sample)  # a sample of a 1-d batch is a numpy scalar: keep it an array (0-d)
    if kind == "ndarray":
        return _packb(sample)
    if kind == "jagged":
        return msgpack.packb([dtype_name, list(sample.shape), sample.tobytes(), int(ragged)], use_bin_type=True)
    return msgpack.packb([dtype_name, list(sample.shape), sample.tobytes()], use_bin_type=True)


def decode_sample(kind: str, value: bytes) -> tuple[str, np.ndarray]:
    """(dtype name, host array in the storage dtype) of a stored tensor-field value; raises on bad bytes."""
    dtype_name, arr, _ragged = decode_jagged(kind, value)
    return dtype_name, arr


def decode_jagged(kind: str, value: bytes) -> tuple[str, np.ndarray, int]:
    """``decode_sample`` and the sample's ragged dimension (0 for samples of other kinds)."""
    kinds = tensor_kinds.registered() if kind != "ndarray" else None  # outside the try: not a corrupt value
    try:
        if kind == "ndarray" or kinds is None:
            arr = _unpackb(value)
            if not isinstance(arr, np.ndarray):
                raise ValueError("not an array")
            return arr.dtype.str, arr, 0
        dtype_name, shape, raw, *rest = msgpack.unpackb(value, raw=False, use_list=True)
        ragged = int(rest[0]) if rest else 0
        dtype = kinds.storage_dtype("tensor", dtype_name)
        return dtype_name, np.frombuffer(raw, dtype=dtype).reshape(shape).copy(), ragged
    except InvalidRecordError:
        raise
    except Exception as exc:
        raise CorruptionError(f"a stored {kind} value cannot be decoded: {exc}") from exc


# msgspec writes the same msgpack bytes as msgpack-python for plain types, about 5x faster for a page of rows
# (100 rows of ~100 bytes: 16 against 84 us), which every put's rows and every read's reply pay.
_pack = msgspec.msgpack.Encoder().encode


_unpack = msgspec.msgpack.Decoder().decode


def unpack_reply_rows(data: Any) -> Any:
    """The rows of a broker's reply (what ``pack`` wrote; ~1.6x faster than msgpack-python). A buffer that is not
    msgpack raises ``ProtocolError``. Only for replies: rows from clients go through msgpack-python's strict
    decoding and ``check_rows``."""
    try:
        return _unpack(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"the reply's rows are not valid msgpack: {exc}") from exc


def pack(obj: Any) -> bytes:
    """msgpack of plain values (the engine's own structures, WAL frames, and rows encode_batch made): nil, bool,
    int, float, str, bytes, lists and str-keyed maps of them. Callers pass nothing else (a row's values are
    storage values by then)."""
    return _pack(obj)
